"""Fixtures for integration tests: a real Kafka broker and one local Spark session.

* ``kafka_bootstrap`` (session): ``$KAFKA_BOOTSTRAP`` if a broker answers there, else the one
  ``scripts/kafka.sh start`` starts or reuses. The broker is left running.
* ``kafka`` (session): a :class:`KafkaHelper` (unique topics, produce, read committed records).
* ``spark`` (session): SparkSession ``local[2]``, 2 shuffle partitions, no UI, UTC, with the
  ``theseus_kafka`` source registered. Created lazily, so tests marked ``own_jvm`` (which run
  a Spark driver in a subprocess) are ordered first and run before this JVM exists: the
  machine has 2 cores and we never run two Spark JVMs at once.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV_PY = ROOT / ".venv" / "bin" / "python"
PYTHON = str(VENV_PY if VENV_PY.exists() else Path(sys.executable))
# For the short-lived drivers the tests start: a serial collector and the client compiler
# alone start a JVM sooner, and the tests' queries are too short for C2 to pay back
# (bench/jvm_start.py measures it).
TEST_DRIVER_JAVA_OPTIONS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto"


# Queries run side by side in the one session at most this many at a time: eight at once
# starved the Python workers of two loaded cores ("Python worker failed to connect back").
SIDE_BY_SIDE = 3


def in_groups(items: list, width: int = SIDE_BY_SIDE) -> list[list]:
    """``items`` in consecutive groups of at most ``width``."""
    return [items[i:i + width] for i in range(0, len(items), width)]


def spark_env() -> dict:
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", PYTHON)
    env.setdefault("PYSPARK_DRIVER_PYTHON", PYTHON)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return env


@pytest.fixture(scope="session")
def driver_java_options(request, tmp_path_factory) -> str:
    """The tests' driver JVM options, with the class-data-sharing archive of the driver's
    classes (``jvm_archive``: made once per machine, about 40 s, then cached) when it can be
    made; without it (no broker, THESEUS_CDS=0) the options alone."""
    opts = TEST_DRIVER_JAVA_OPTIONS
    if os.environ.get("THESEUS_CDS", "1") == "0":
        return opts
    from tests.integration import jvm_archive

    try:
        dest = jvm_archive.archive_path()
        if not dest.exists():
            bootstrap = request.getfixturevalue("kafka_bootstrap")
            why = jvm_archive.make_archive(bootstrap, opts, dest,
                                           tmp_path_factory.mktemp("cds"))
            if why:
                print(f"\nno class-data-sharing archive for the test drivers: {why}",
                      file=sys.stderr)
                return opts
    except (OSError, subprocess.SubprocessError, pytest.skip.Exception) as e:
        print(f"\nno class-data-sharing archive for the test drivers: {e}", file=sys.stderr)
        return opts
    return f"{opts} -XX:SharedArchiveFile={dest}"


@pytest.fixture(scope="module", autouse=True)
def _test_driver_java_options(request):
    """Every ``theseus`` the module's tests spawn inherits the tests' driver JVM options
    (unless the environment already sets THESEUS_SPARK_CONF); undone after the module, so
    the unit tests never see it."""
    if os.environ.get("THESEUS_SPARK_CONF"):
        yield
        return
    opts = request.getfixturevalue("driver_java_options")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("THESEUS_SPARK_CONF", f"spark.driver.extraJavaOptions={opts}")
        yield


def _processes_under(folder: str) -> list[int]:
    """The pids (not ours) whose command line names a path under ``folder``."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if folder in cmd:
            out.append(int(d.name))
    return out


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test(request):
    """A query host, migrator or feeder a test started in its own tmp_path is gone when
    the test ends: a test that failed half-way (its own cleanup not reached) would
    otherwise leave its queries running for the rest of the suite, on two cores (a CI run
    carried one failed test's three Spark drivers for its last 40 minutes).  Each one left
    is named, then stopped (TERM, then KILL)."""
    yield
    tmp = request.node.funcargs.get("tmp_path")
    if tmp is None:
        return
    import signal

    left = _processes_under(str(tmp) + os.sep)
    for pid in left:
        print(f"\n{request.node.nodeid}: pid {pid} outlived the test; stopped",
              file=sys.stderr)
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 15
    while left and time.monotonic() < deadline:
        left = [p for p in left if Path(f"/proc/{p}").exists() and
                "\tZ" not in _status(p)]
        time.sleep(0.2)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _status(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return ""


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "own_jvm: runs a Spark driver in a subprocess; ordered before in-process Spark")


def pytest_collection_modifyitems(session, config, items):
    """Within this directory, run ``own_jvm`` tests before the others (stable order)."""
    here = str(Path(__file__).parent)
    idx = [i for i, it in enumerate(items) if str(it.path).startswith(here)]
    mine = [items[i] for i in idx]
    ordered = [it for it in mine if it.get_closest_marker("own_jvm")] + \
              [it for it in mine if not it.get_closest_marker("own_jvm")]
    for i, it in zip(idx, ordered):
        items[i] = it


# --------------------------------------------------------------------------- Kafka

@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    if not os.environ.get("KAFKA_BOOTSTRAP") and shutil.which("java") is None:
        pytest.skip("no KAFKA_BOOTSTRAP and no java on PATH to start a local broker")
    try:
        r = subprocess.run(["bash", str(ROOT / "scripts" / "kafka.sh"), "start"], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail("scripts/kafka.sh start did not finish within 300 s")
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("KAFKA_BOOTSTRAP=")]
    if r.returncode != 0 or not lines:
        pytest.fail(f"scripts/kafka.sh start failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    bootstrap = lines[-1].split("=", 1)[1].strip()
    from gates.broker import wait_coordinators

    wait_coordinators(bootstrap)  # a fresh broker answers before its coordinators load
    return bootstrap


@dataclass
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list | None

    def json(self):
        return None if self.value is None else json.loads(self.value)

    def key_json(self):
        return None if self.key is None else json.loads(self.key)


class KafkaHelper:
    def __init__(self, bootstrap: str, conf: dict | None = None, replication: int = 1):
        """``conf``: more client settings (a secured broker's credentials); ``replication``:
        the replication factor of the topics it creates (-1: the cluster's default)."""
        from confluent_kafka.admin import AdminClient

        self.bootstrap = bootstrap
        self.conf = {"bootstrap.servers": bootstrap, **(conf or {})}
        self.replication = replication
        self.admin = AdminClient(self.conf)
        self.created: list[str] = []

    def topic(self, prefix: str = "t", partitions: int = 3, config: dict | None = None,
              timeout: float = 30.0) -> str:
        """Create a topic with a unique name; wait until every partition has a leader."""
        from confluent_kafka.admin import NewTopic

        name = f"it-{prefix}-{uuid.uuid4().hex[:10]}"
        fut = self.admin.create_topics([NewTopic(name, partitions, self.replication,
                                                 config=config or {})],
                                       request_timeout=timeout)[name]
        fut.result(timeout=timeout)
        self.created.append(name)
        deadline = time.monotonic() + timeout
        while True:
            md = self.admin.list_topics(name, timeout=timeout).topics.get(name)
            if md is not None and md.error is None and len(md.partitions) == partitions and \
                    all(p.leader >= 0 for p in md.partitions.values()):
                return name
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {name} not ready after {timeout}s")
            time.sleep(0.1)

    def produce(self, topic: str, values: list, *, partition=None, keys: list | None = None,
                headers=None, timeout: float = 30.0) -> list[tuple[int, int]]:
        """Produce records (dict/list → JSON, str → UTF-8, bytes as is, None → tombstone).

        ``partition``: an int, a function index → partition, or None (by key / round-robin
        over partitions when there is no key). Returns (partition, offset) per record, in order.
        """
        from confluent_kafka import Producer

        def enc(v):
            if v is None or isinstance(v, bytes):
                return v
            if isinstance(v, str):
                return v.encode()
            return json.dumps(v, separators=(",", ":")).encode()

        nparts = len(self.admin.list_topics(topic, timeout=timeout).topics[topic].partitions)
        p = Producer({**self.conf, "enable.idempotence": True, "acks": "all",
                      "linger.ms": 5, "partitioner": "murmur2_random"})
        out: list = [None] * len(values)
        errors: list = []

        def cb(i):
            def f(err, msg):
                if err is not None:
                    errors.append(err)
                else:
                    out[i] = (msg.partition(), msg.offset())
            return f

        try:
            for i, v in enumerate(values):
                kw = {}
                k = keys[i] if keys is not None else None
                if callable(partition):
                    kw["partition"] = partition(i)
                elif partition is not None:
                    kw["partition"] = partition
                elif k is None:
                    kw["partition"] = i % nparts
                p.produce(topic, value=enc(v), key=enc(k), headers=headers,
                          on_delivery=cb(i), **kw)
                if i % 10000 == 9999:
                    p.poll(0)
            left = p.flush(timeout)
        finally:
            p.flush(0)
        assert not left and not errors, f"produce failed: {left} left, errors {errors[:3]}"
        return out

    def end_offsets(self, topic: str, timeout: float = 30.0,
                    settle: float = 10.0) -> dict[int, int]:
        """The last stable offset of every partition, once it has caught up with the end.

        A transaction's commit returns before the broker has written its markers into the
        partitions, and the last stable offset moves only with them: read right after a
        commit, it can still stand before the records just committed (seen in CI: a batch
        committed by the sink, missing from the read). So wait, up to ``settle`` seconds,
        until no transaction is open (last stable offset == high watermark); a test that
        leaves one open on purpose gets the last stable offset after that wait.
        """
        from confluent_kafka import IsolationLevel, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        parts = self.admin.list_topics(topic, timeout=timeout).topics[topic].partitions

        def offsets(level) -> dict[int, int]:
            futs = self.admin.list_offsets({TopicPartition(topic, p): OffsetSpec.latest()
                                            for p in parts},
                                           isolation_level=level, request_timeout=timeout)
            return {tp.partition: f.result(timeout=timeout).offset for tp, f in futs.items()}

        deadline = time.monotonic() + settle
        while True:
            stable = offsets(IsolationLevel.READ_COMMITTED)
            if (stable == offsets(IsolationLevel.READ_UNCOMMITTED)
                    or time.monotonic() > deadline):
                return stable
            time.sleep(0.1)

    def read_all(self, topic: str, timeout: float = 60.0) -> list[Record]:
        """Every committed record of the topic (read_committed, up to the last stable offset)."""
        from confluent_kafka import Consumer, KafkaError, TopicPartition

        ends = self.end_offsets(topic, timeout)
        todo = {p for p, e in ends.items() if e > 0}
        c = Consumer({**self.conf,
                      "group.id": f"it-reader-{uuid.uuid4().hex[:8]}",
                      "enable.auto.commit": False, "isolation.level": "read_committed",
                      "enable.partition.eof": True, "auto.offset.reset": "earliest"})
        out: list[Record] = []
        try:
            c.assign([TopicPartition(topic, p, 0) for p in sorted(todo)])
            deadline = time.monotonic() + timeout
            while todo:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"read_all({topic}): partitions {todo} not read up to "
                                       f"{ends} within {timeout}s")
                for m in c.consume(1000, timeout=0.5):
                    if m.error() is not None:
                        if m.error().code() == KafkaError._PARTITION_EOF:
                            if m.offset() >= ends[m.partition()]:
                                todo.discard(m.partition())
                            continue
                        raise RuntimeError(str(m.error()))
                    if m.offset() >= ends[m.partition()]:
                        todo.discard(m.partition())
                        continue
                    out.append(Record(topic, m.partition(), m.offset(), m.key(), m.value(),
                                      m.headers()))
                    if m.offset() == ends[m.partition()] - 1:
                        todo.discard(m.partition())
        finally:
            c.close()
        return out

    def delete_created(self, timeout: float = 30.0) -> None:
        if not self.created:
            return
        futs = self.admin.delete_topics(self.created, request_timeout=timeout)
        for f in futs.values():
            try:
                f.result(timeout=timeout)
            except Exception:
                pass
        self.created.clear()


@pytest.fixture(scope="session")
def kafka(kafka_bootstrap):
    h = KafkaHelper(kafka_bootstrap)
    yield h
    h.delete_created()


# --------------------------------------------------------------------------- Spark

@pytest.fixture(scope="session")
def spark():
    for k, v in spark_env().items():
        if k in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_LOCAL_IP"):
            os.environ[k] = v
    from pyspark.sql import SparkSession

    from gates.source import register

    builder = SparkSession.builder
    try:
        # Spark's own Kafka connector, for the tests that run PySpark jobs as users wrote
        # them (plan import, faithfulness): fetched once by mvn, cached.
        from migrate.adopt.jars import avro_jars, connector_jars

        jars = connector_jars()
        with contextlib.suppress(Exception):  # from_avro/to_avro jobs only
            jars += avro_jars()
        builder = builder.config("spark.jars", ",".join(jars))
    except Exception:  # no mvn, no network: those tests skip (kafka_connector fixture)
        pass
    s = (builder.master("local[2]").appName("theseus-it")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.default.parallelism", "2")
         .config("spark.ui.enabled", "false")
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.driver.memory", "1g")
         .config("spark.sql.streaming.stopTimeout", "30s")
         .getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    register(s)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def kafka_connector(spark):
    """The shared session, when Spark's Kafka connector is on its class path."""
    from migrate.adopt.job import _has_kafka

    if not _has_kafka(spark):
        pytest.skip("Spark's Kafka connector jars are not available (mvn, Maven Central)")
    return spark


def jvm_running() -> bool:
    """True if this process already launched a Spark JVM.  Always False on a pytest-xdist
    worker (`make test`'s parallel group): the other worker's JVM runs beside it anyway, so
    "one Spark JVM at a time" is the serial group's rule, not a reason to skip."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return False
    if "pyspark" not in sys.modules:
        return False
    from pyspark import SparkContext

    return SparkContext._gateway is not None


def run_available_now(df, checkpoint, fn, timeout: float = 240.0):
    """Run ``df`` with trigger(availableNow=True) through foreachBatch ``fn``; wait; raise."""
    q = (df.writeStream.foreachBatch(fn).option("checkpointLocation", str(checkpoint))
         .trigger(availableNow=True).start())
    try:
        finished = q.awaitTermination(timeout)
    finally:
        if q.isActive:
            q.stop()
    if q.exception() is not None:
        raise AssertionError(f"streaming query failed: {q.exception()}")
    assert finished, f"availableNow query did not finish within {timeout}s"
    return q
