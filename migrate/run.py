"""The query host: ``theseus run PLAN`` builds the plan's query on Spark and keeps it running.

1. Load and validate the plan (``compat``): a plan Spark cannot run fails here, with the reason.
   A source topic that does not exist is refused, and a missing output topic created
   (:mod:`migrate.plantopics`), before anything is written and before Spark starts.
2. Record the plan, its checkpoint and status ``starting`` in the store.
3. Start Spark (shuffle partitions = ``config.state_partitions``) and the query.
4. Report progress per micro-batch; stop after the current batch on Ctrl-C, SIGTERM or a
   stop request in the store (``theseus stop``, which waits until the status says stopped:
   :func:`stop_host`); with ``--available-now`` exit when all input that was in the topics
   at start has been processed.  One signal is enough: a batch held at a migration's start
   gate is abandoned (it runs again at restart), so the stop never waits on the migrator;
   a second Ctrl-C stops the query without waiting for its batch.  Never a traceback.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from compat.check import load_plan
from compat.errors import BrokerError, DeadlineExceeded, Refused, RuntimeFailure, TheseusError
from compat.model import Plan
from compat.serde import dumps
from gates.deadline import Deadline
from migrate import plantopics
from migrate.record import source_digest
from migrate.store import DirectoryStore, open_store

DEFAULT_STATE_PARTITIONS = 4
#: a migration's shadow (``--gated-start``) reads its history in about this many batches, so
#: that its progress shows while it reads (``gates.source``'s ``backfillBatches``).  Few:
#: a micro-batch of the ship-load plan costs about 0.75 s whatever it reads (1.7 s beside
#: the old query), and 11,000 records add about 0.4 s to that
#: (bench/results/profile_backfill.md); ten made a backfill of 120,000 records twelve
#: batches against the plan alone's two.  Four still move the bar three times.
BACKFILL_BATCHES = 4
#: seconds between two heartbeats of a host in its status (``heartbeat_at``): how another
#: host tells that the process is alive (``theseus status``)
HEARTBEAT_EVERY = 5.0


def spark_env() -> None:
    """Spark's Python workers must run this interpreter, bound to loopback here."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


_SESSION: Any = None


def spark_session(master: str = "local[2]", shuffle_partitions: int = 4,
                  jars: Sequence[str] = ()) -> Any:
    """One SparkSession per process (tests share it); shuffle partitions set per query.
    ``jars`` go on the class path of the session this call starts (Spark's own Kafka
    connector, for ``prove --runtime spark``)."""
    global _SESSION
    spark_env()
    if _SESSION is None:
        from pyspark.sql import SparkSession

        from migrate.build.core import COMMIT_VALIDATION

        builder = SparkSession.builder
        if jars:
            builder = builder.config("spark.jars", ",".join(jars))
        if not master.startswith("local"):
            # A cluster's executors: small, one core each; their Python is this
            # interpreter's path (a real cluster installs the same venv at the same path on
            # every worker, or sets spark.pyspark.python), never the workers' environment.
            builder = builder.config("spark.executor.memory", "512m") \
                .config("spark.executor.cores", "1") \
                .config("spark.pyspark.python", sys.executable)
        # THESEUS_SPARK_CONF="spark.cores.max=1;spark.executor.memory=1g": more Spark
        # settings for the driver this process starts (two queries sharing a standalone
        # cluster need spark.cores.max, or the first takes every core)
        for item in filter(None, os.environ.get("THESEUS_SPARK_CONF", "").split(";")):
            key, sep, value = item.partition("=")
            if not sep or not key.strip().startswith("spark."):
                raise RuntimeFailure("malformed THESEUS_SPARK_CONF entry",
                                     expected="spark.<name>=<value>[;...]", found=repr(item))
            builder = builder.config(key.strip(), value.strip())
        _SESSION = (builder.master(master).appName("theseus")
                    .config("spark.ui.enabled", "false")
                    .config("spark.ui.showConsoleProgress", "false")
                    .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
                    .config("spark.sql.session.timeZone", "UTC")
                    .config("spark.driver.memory", "2g")
                    .config("spark.sql.streaming.stateStore.providerClass",
                            "org.apache.spark.sql.execution.streaming.state."
                            "RocksDBStateStoreProvider")
                    .config("spark.sql.execution.arrow.pyspark.enabled", "true")
                    # the gated sink skips a batch on purpose (migrate.build.core)
                    .config(COMMIT_VALIDATION, "false")
                    .getOrCreate())
        _SESSION.sparkContext.setLogLevel("ERROR")
        _quiet_query_failures(_SESSION)
        ship_code(_SESSION)
    _SESSION.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions))
    return _SESSION


def start_query(plan: Plan, *, bootstrap: str, store: DirectoryStore, master: str,
                available_now: bool, generation: int = 0, query_name: str | None = None,
                trigger_interval: str = "1 second", start_gate: Any = None,
                shadow_topic: str | None = None, on_retire: Any = None,
                reconciler: Any = None, backfill_batches: int = 0) -> Any:
    from migrate.build import Builder, BuildOptions

    name = query_name or plan.query
    spark = spark_session(master, plan.state_partitions or DEFAULT_STATE_PARTITIONS)
    checkpoint = store.checkpoint(plan.query, generation)
    opts = BuildOptions(bootstrap=bootstrap, store=str(store.root), query=name,
                        available_now=available_now, trigger_interval=trigger_interval,
                        checkpoint=str(checkpoint), start_gate=start_gate,
                        shadow_topic=shadow_topic, on_retire=on_retire,
                        reconciler=reconciler, backfill_batches=backfill_batches)
    return Builder(spark, plan, opts).start()


def run(plan_path: str, *, bootstrap: str, state: str, master: str = "local[2]",
        available_now: bool = False, echo: Callable[[str], None] = print,
        trigger_interval: str = "1 second", instance: str | None = None,
        generation: int | None = None, gated_start: bool = False,
        shadow_topic: str | None = None) -> int:
    """Host one query instance.  ``instance`` names it in the store (default: the plan's
    query); a migration starts the new plan as instance ``<query>.g<generation>`` with
    ``gated_start`` (its sink obeys the start gate the migrator opens at the cutover)."""
    # Step 1. Validate before anything is deployed; with an authorizer, refuse a topic the
    # user may not read or write before anything is written.
    digest = source_digest(plan_path)  # the bytes that are loaded, read first
    plan = load_plan(plan_path)
    from gates.broker import check_access

    try:
        check_access(bootstrap, plan_access(plan, shadow_topic))
        plantopics.prepare(plan, bootstrap, plan_path, echo)
    except DeadlineExceeded as e:
        # no migration step here (5): a broker that does not answer in time is a runtime
        # failure of the run (4)
        raise BrokerError(f"broker {bootstrap}: {e.message}") from None
    store = open_store(state)
    name = instance or plan.query
    # Step 2. Record what runs where, and the digest of the file it came from: a job
    # file is its plan's source of truth (status and check --query compare with it).
    store.put_plan(name, dumps(plan))
    store.clear_stop(name)
    if generation is None:
        generation = int(store.status(name).get("generation", 0))
    # The host on every start, not only the first: a query moved to another host is
    # found there (check --query, the migrator's checkpoint check read the checkpoint
    # where it is, or say where that is).
    store.set_status(name, status="starting", pid=os.getpid(), bootstrap=bootstrap,
                     checkpoint=str(store.checkpoint(plan.query, generation)),
                     generation=generation, plan_query=plan.query,
                     host=socket.gethostname(), plan_file=os.path.abspath(plan_path),
                     plan_digest=digest,
                     heartbeat_at=time.time(), heartbeat_every=HEARTBEAT_EVERY)
    start_gate = reconciler = None
    if gated_start:
        from gates.reconcile import Reconciler
        from gates.startgate import StartGate

        start_gate = StartGate(store.root, name)
        # inert unless the migration asks for it in the start gate (``--reconcile``)
        reconciler = Reconciler(store.root, name, bootstrap, plan.sink.topic)
    # Step 3. Start Spark and the query.
    from gates.state import retired

    handed_over = threading.Event()  # set by the sink when a migration's new query took over
    query = start_query(plan, bootstrap=bootstrap, store=store, master=master,
                        available_now=available_now, generation=generation,
                        trigger_interval=trigger_interval, query_name=name,
                        start_gate=start_gate, shadow_topic=shadow_topic,
                        on_retire=handed_over.set, reconciler=reconciler,
                        backfill_batches=BACKFILL_BATCHES if gated_start else 0)
    # A plan with recursion runs loop queries beside its output query: their gates and
    # internal topics are recorded, for a migration caps the loops and cuts the topics.
    store.set_status(name, status="running", query_id=str(query.id),
                     loops=dict(getattr(query, "loops", None) or {}))
    echo(f"theseus: running '{name}' (checkpoint {store.checkpoint(plan.query, generation)})")
    # Step 4. Progress, and a graceful stop.
    stop = {"asked": False, "now": False}

    def on_signal(signum: int, frame: Any) -> None:
        # Only flags: raising here would unwind whatever the main thread is in (a py4j
        # call) and leave a traceback in the host's log.
        if not stop["asked"]:
            stop["asked"] = True
            echo("theseus: stopping after the current batch" + (
                " (Ctrl-C again to stop at once)" if signum == signal.SIGINT else ""))
        elif signum == signal.SIGINT and not stop["now"]:
            stop["now"] = True
            echo("theseus: stopping now")
        else:
            echo("theseus: already stopping")
        if start_gate is not None:
            start_gate.abandon.set()

    old_handler = signal.signal(signal.SIGINT, on_signal)
    old_term = signal.signal(signal.SIGTERM, on_signal)
    seen = -1
    beat = time.monotonic()
    try:
        # a plan with recursion runs as a chain of queries: its loops report in notes
        notes = getattr(query, "notes", list)
        while query.isActive:
            for line in notes():
                echo(line)
            for p in query.recentProgress:
                if p["batchId"] > seen:
                    seen = p["batchId"]
                    echo(progress_line(p))
            if handed_over.is_set() or retired(store.root, name):
                # Its last batch before a migration's cut is committed and the new query
                # writes from there: stop at once, before Spark spends a batch on nothing.
                handed_over.set()
                query.stop()
                break
            if stop["asked"] or store.stop_requested(name):
                if start_gate is not None:  # a batch held there would hold the stop
                    start_gate.abandon.set()
                stop_after_batch(query, now=lambda: stop["now"])
                break
            if time.monotonic() - beat >= HEARTBEAT_EVERY:
                # alive, as a host elsewhere can tell (a pid says it on this host only)
                store.set_status(name, heartbeat_at=time.time(), last_batch=seen)
                beat = time.monotonic()
            handed_over.wait(0.5)
        for line in notes():
            echo(line)
        for p in query.recentProgress:
            if p["batchId"] > seen:
                seen = p["batchId"]
                echo(progress_line(p))
        exc = query.exception()
        if exc is not None and start_gate is not None and \
                start_gate.abandoned is not None:
            # asked to stop while a batch waited at the start gate: that batch was not
            # written and runs again at restart
            store.set_status(name, status="stopped", last_batch=seen, handed_over=False)
            echo(f"theseus: '{name}' stopped after batch {seen} (batch "
                 f"{start_gate.abandoned} waited at the start gate; it runs again at "
                 "restart)")
            return 0
        if exc is not None:
            from gates.kafkaconf import redact

            text = failure_text(exc)
            store.set_status(name, status="failed", error=redact(text)[:8000])
            raise RuntimeFailure(f"the query failed: {redact(failure_message(text))}",
                                 file=plan_path, node=None)
        store.set_status(name, status="stopped", last_batch=seen,
                         handed_over=handed_over.is_set())
        if handed_over.is_set():
            echo(f"theseus: '{name}' handed its output over at the migration's cut; "
                 f"stopped after batch {seen}")
            # Exit when the migrator says so (or in a minute): tearing the JVM down now
            # would take CPU from the new query's first batches.
            linger = Deadline(60)
            while not linger.expired() and not stop["asked"] and \
                    not store.stop_requested(name):
                time.sleep(0.2)
            return 0
        echo(f"theseus: '{name}' stopped after batch {seen}")
        return 0
    finally:
        signal.signal(signal.SIGINT, old_handler)
        signal.signal(signal.SIGTERM, old_term)
        if query.isActive:
            query.stop()


def stop_host(store: DirectoryStore, query: str, timeout: float = 120.0) -> str:
    """``theseus stop``: ask the host of ``query``'s live instance to stop after its batch
    and wait until its status says it stopped (or failed), or its process is gone.  Returns
    the line to print.  Not running: Refused (exit 6, saying why); unknown query:
    TheseusError (exit 2); still running after ``timeout``: RuntimeFailure (exit 4)."""
    from gates.lease import process_alive, this_host

    instance = store.live_instance(query)
    st = store.status(instance)
    if not st:
        raise TheseusError(f"no query named '{query}' in the store", file=str(store),
                           expected="a query started with theseus run", found=repr(query))
    name = f"'{query}'" if instance == query else f"'{query}' ({instance})"

    def gone() -> bool:
        s = store.status(instance)
        here = s.get("host") == this_host()
        pid = int(s.get("pid") or 0)
        alive = here and process_alive(pid)
        if s.get("status") in ("starting", "running"):
            return here and not alive  # a host of this machine that died without a word
        # stopped or failed; a query that handed over at a migration's cut lingers until
        # it is asked to stop (its pid, unless another process took it since)
        return not (alive and _a_host(pid))

    if gone():
        was = store.status(instance)
        why = was.get("status") or "unknown"
        if was.get("status") in ("starting", "running"):
            why = f"its host, pid {was.get('pid')}, is gone"
        # the state asked for holds, but nothing was stopped: a script must tell (6)
        raise Refused(f"{name} is not running ({why}); nothing to stop", file=str(store),
                      expected="a running query", found=why)
    store.request_stop(instance)
    store.flush()
    deadline = Deadline(timeout)
    while not gone():
        if deadline.expired():
            raise RuntimeFailure(f"{name} did not stop within {timeout:.0f} s",
                                 file=str(store.log_path(instance)),
                                 hint=f"its host is pid {st.get('pid')} on {st.get('host')}")
        time.sleep(0.2)
    done = store.status(instance)
    if done.get("status") == "failed":
        return f"theseus: {name} failed as it stopped: {failure_message(done.get('error') or '')}"
    return f"theseus: {name} stopped" + (f" after batch {done['last_batch']}"
                                         if done.get("last_batch") is not None else "")


def _a_host(pid: int) -> bool:
    """Process ``pid`` of this machine runs ``theseus run``."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return False
    return b"run" in args and any(a.endswith((b"migrate.cli", b"theseus")) for a in args)


def ship_code(spark: Any) -> str | None:
    """On a cluster, ship Theseus's own packages to the executors with the job (a zip added
    with ``addPyFile``): the gated source's reader runs there and must be this version of
    the code, whatever the workers' Python path holds.  Returns the zip's path (None in
    local mode, where the executors are this machine's Python workers of this venv)."""
    if spark.sparkContext.master.startswith("local"):
        return None
    import tempfile
    import zipfile
    from pathlib import Path

    import compat

    root = Path(compat.__file__).resolve().parent.parent
    # a new folder per driver: the zip's name is what the executors import it by
    path = os.path.join(tempfile.mkdtemp(prefix="theseus-"), "theseus-code.zip")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for pkg in ("compat", "gates", "migrate"):
            for f in sorted((root / pkg).rglob("*.py")):
                z.write(f, f.relative_to(root).as_posix())
            for f in sorted((root / pkg).rglob("*.json")):
                z.write(f, f.relative_to(root).as_posix())
    spark.sparkContext.addPyFile(path)
    return path


def plan_access(plan: Plan, shadow_topic: str | None = None) -> list[tuple[str, str, str]]:
    """What the query of ``plan`` needs on which topic (``gates.broker.check_access``)."""
    from compat.steps import Source

    needs = [(n.topic, "READ", f"source '{n.id}' reads") for n in plan.nodes.values()
             if isinstance(n, Source)]
    needs.append((plan.sink.topic, "WRITE", f"sink '{plan.sink_id}' writes the output to"))
    if shadow_topic:
        needs.append((shadow_topic, "WRITE", "the shadow writes its comparison output to"))
    return needs


def _quiet_query_failures(spark: Any) -> None:
    """Spark logs a failed query's whole JVM stack trace at ERROR before the host can say
    what failed: the host reports it in one line (:func:`failure_message`) and records the
    whole text in the store's status, so that log is left out.  So is py4j's traceback of an
    error raised in the sink (``foreachBatch`` runs in this process, called back by the
    JVM): it reaches the host as the query's exception, and a batch abandoned at a start
    gate as the host stops is no error at all."""
    for name in ("py4j.clientserver", "py4j.java_gateway"):
        logging.getLogger(name).addFilter(_not_a_callback_error)
    try:
        jvm = spark.sparkContext._jvm
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            "org.apache.spark.sql.execution.streaming", jvm.org.apache.logging.log4j.Level.OFF)
    except Exception:  # another logging backend: keep Spark's log
        pass


def _not_a_callback_error(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("There was an exception while executing the "
                                          "Python Proxy")


def _error_names() -> set[str]:
    names, todo = set(), [TheseusError]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return names


#: how a JVM stack trace names each exception under the one thrown
CAUSED_BY = "Caused by: "


def failure_text(exc: Any) -> str:
    """A failed query's exception as text, with the JVM's causes after its first line.
    PySpark's ``str()`` leaves them out (unless ``spark.sql.pyspark.jvmStacktrace.enabled``),
    and some of Spark's wrappers say nothing themselves: a CI run's old query failed with
    "Exception thrown in awaitResult: " and no word of why."""
    text = str(exc)
    # a StreamingQueryException keeps its own frames; its cause (converted by PySpark)
    # keeps the JVM's whole chain, each exception under it a "Caused by: " line
    causes: list[str] = []
    e, depth = exc, 0
    while e is not None and depth < 5:
        for line in str(getattr(e, "_stackTrace", None) or "").splitlines():
            line = line.strip()
            if line.startswith(CAUSED_BY) and line not in causes:
                causes.append(line)
        e, depth = getattr(e, "_cause", None), depth + 1
    if not causes or "JVM stacktrace:" in text:
        return text
    first, _, rest = text.partition("\n")
    return "\n".join([first, *causes[:10], *([rest] if rest else [])])


def failure_message(text: str) -> str:
    """What a failed query's error says went wrong, in one line.  Spark wraps an error raised
    in Python (the gated source, the sink) in its own message that carries the Python
    traceback; its last ``<module>.<Class>: message`` line of a Theseus error says it best,
    else the last Python exception line, else Spark's first line, followed by the JVM's
    deepest cause (:func:`failure_text`) when that line says nothing after its colon."""
    lines = text.splitlines()
    names = "|".join(sorted(_error_names()))
    theseus = re.compile(rf"^(?:[\w.]+\.)?(?:{names}): (.+)$")
    python = re.compile(r"^[\w.]*(?:Error|Exception): (.+)$")
    for pattern in (theseus, python):
        found = [m.group(1) for m in map(pattern.match, lines) if m]
        if found:
            return found[-1].strip()
    first = (lines[0] if lines else text).strip()
    causes = [ln.strip()[len(CAUSED_BY):] for ln in lines if ln.strip().startswith(CAUSED_BY)]
    if causes and (not first or first.endswith(":")):
        return f"{first} {causes[-1]}".strip()
    return first


def stop_after_batch(query: Any, timeout: float = 10.0,
                     now: Callable[[], bool] = lambda: False) -> None:
    """Stop between batches: wait until no trigger is active (or ``now()``), then stop.

    A query whose batches run back to back is never idle; after ``timeout`` it is stopped
    mid-batch, which is safe: the batch is replayed on restart and the exactly-once sink
    skips what it already committed."""
    deadline = Deadline(timeout)
    while not deadline.expired() and query.isActive and not now():
        status = query.status
        if not status.get("isTriggerActive", False):
            break
        time.sleep(0.05)
    query.stop()


def progress_line(p: dict[str, Any]) -> str:
    lag = 0
    for s in p.get("sources", []):
        lag += _lag(s.get("endOffset"), s.get("latestOffset"))
    rate = p.get("processedRowsPerSecond") or 0.0
    took = (p.get("durationMs") or {}).get("triggerExecution", 0)
    line = (f"  batch {p['batchId']}: {p.get('numInputRows', 0)} rows in, "
            f"{rate:,.0f} rows/s, lag {lag}, {took} ms (from {p.get('timestamp', '?')})")
    if os.environ.get("THESEUS_PROGRESS_DETAIL"):
        import json
        line += " " + json.dumps({"durationMs": p.get("durationMs"), "state": [
            {k: o.get(k) for k in ("commitTimeMs", "allUpdatesTimeMs", "numRowsTotal")}
            for o in p.get("stateOperators", [])]})
    return line


def _lag(end: Any, latest: Any) -> int:
    import json

    try:
        e = json.loads(end) if isinstance(end, str) else end or {}
        lt = json.loads(latest) if isinstance(latest, str) else latest or {}
        total = 0
        for topic, parts in lt.items():
            for part, off in parts.items():
                total += max(0, int(off) - int(e.get(topic, {}).get(part, 0)))
        return total
    except (ValueError, TypeError, AttributeError):
        return 0
