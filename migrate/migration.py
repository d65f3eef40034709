"""Live migrations: swap a running query for a new plan at one exact cut in its input.

The protocol is DESIGN.md's "Migrating live"; the step numbers below are its numbers, and
:data:`PHASES` is the one table of the phases with their numbers on both paths.
Every phase is written to the store *before* it acts, and every phase is idempotent, so a
migrator killed anywhere resumes (``theseus migrate resume``) or rolls back
(``theseus migrate abort``) without loss.  All coordination goes through the store: the old
query may run in another process on another host.  One :class:`~gates.deadline.Deadline`
(``--timeout``) bounds every wait and every Kafka call of a run; running out raises one
:class:`~compat.errors.DeadlineExceeded` naming what was awaited.  A failure of a step (a
broker that does not answer, a control record not delivered) ends the run with one
:class:`~compat.errors.MigrationError` naming the step, the phase stays recorded, and
``resume`` retries it.

1. Check     refuse ``unsupported``; ``in_place`` is a graceful stop and a restart on the
             same checkpoint (unless ``--strategy shadow``): the in-place path, below —
             once the checkpoint check agrees (``auto`` goes through a shadow when the
             checkpoint contradicts the plan check or cannot be read on this host).
2. Shadow    start the new plan as a new instance (fresh checkpoint, earliest offsets) with
             its start gate closed: its output is discarded while it backfills.
3. Pause     when the shadow keeps pace near the head (``steady_batches`` batches in a
             row), cap both queries at the high watermarks H and wait until both
             acknowledge H.
4. Cut       write one control event into every partition of every source topic; their
             offsets are the cut C (``--cut offsets``: C = H, nothing is written).  C is
             checked to be at or beyond H in every partition (a topic deleted and
             created again since the pause would put it behind).  Both
             gates now admit data up to C; the shadow's cap *follows* the old query: it
             reads on past C by itself, and its start gate opens *from C*, holding the
             first batch from C until the old query acknowledged C (all its output
             before C committed) — without waiting for this process, so the shadow
             computes that batch while the old query finishes and the output stall is
             about one batch.  The old query's cap *retires* it: once it acknowledged C
             its sink writes nothing more and its host stops it.
5. Align     wait until both queries acknowledge C: everything before C is committed.
             (A cascade's upstream waits for its old query here and propagates its cut
             into its output at once; its shadow's alignment is awaited before the
             downstream shadow switches and before its own cutover: ``migrate.cascade``.)
6. Cutover   wait until the shadow writes; record its gates open; stop the old query.
             A reconciling shadow (``--reconcile``, :mod:`gates.reconcile`) writes, in the
             transaction of its first batch from C, the corrections that make the compacted
             output the new plan over all input before C; this step waits until they are
             committed (restarting the shadow's host if it died) and records their counts.
7. Finish    record the new plan and instance as the query's; the migration is done.

The in-place path (DESIGN.md's step 1 carried out) has its own numbers:

1. Check     as above; the verdict is ``in_place`` (or ``identical``).
2. In place  stop the query between batches, restart it on the same checkpoint with the
             new plan (skipped when resumed after it already runs the new plan).
3. Finish    record the new plan as the query's; the migration is done.

``abort`` before the cutover vetoes the hand-over atomically with the old query's
acknowledgements (one lock, one file) and refuses when the old query already acknowledged
C (the shadow may be writing): ``resume`` then finishes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from compat.check import check_plans, load_plan
from compat.errors import (
    BrokerError,
    DeadlineExceeded,
    MigrationError,
    RuntimeFailure,
    StoreError,
)
from compat.model import Plan
from compat.steps import Recursive, Source
from compat.steps.source import SNAPSHOT, table_read
from gates import kafkaconf
from gates.broker import client_conf, watermarks
from gates.control import close_producer
from gates.deadline import Deadline
from gates.files import atomic_write
from gates.startgate import StartGate, write_start_gate
from gates.state import (
    GateState,
    GateStateError,
    ack_path,
    acked_offsets,
    handed_over,
    is_acked,
    read_ack,
    read_gate,
    saw_cap,
    veto,
    write_gate,
)
from migrate.store import DirectoryStore, read_json

# Every phase of both paths, in the order they run, with its step number on each path
# (None: not on that path).  The shadow path's numbers are DESIGN.md's steps; the in-place
# path is DESIGN's step 1 carried out (a graceful stop and a restart on the checkpoint).
#          phase        shadow  in place
PHASES: dict[str, tuple[int | None, int | None]] = {
    "check": (1, 1),
    "in_place": (None, 2),
    "shadow": (2, None),
    "pause": (3, None),
    "cut": (4, None),
    "align": (5, None),
    "propagate": (None, None),  # part of step 5 for a cascade's upstream: its output's cut
    "cutover": (6, None),
    "finish": (7, 3),
    "done": (8, 4),
}
TERMINAL = ("done", "aborted", "refused")
#: seconds between two looks at a query's acknowledgements while the output is handed over
#: (steps 5 and 6, a cascade's adoption of the propagated cut): each look reads a small file,
#: and every wait of the hand-over is part of the output's stall
CUT_POLL = 0.05


def trigger_seconds(trigger: str) -> float:
    """Seconds of a processing-time trigger as ``--trigger`` says it (``1 second``,
    ``500 milliseconds``, ``2 minutes``); 1.0 when it does not parse."""
    units = {"ms": 0.001, "millisecond": 0.001, "s": 1.0, "sec": 1.0, "second": 1.0,
             "min": 60.0, "minute": 60.0, "h": 3600.0, "hour": 3600.0}
    parts = trigger.strip().lower().split()
    try:
        n = float(parts[0])
    except (IndexError, ValueError):
        return 1.0
    unit = parts[1].rstrip("s") if len(parts) > 1 else "s"
    unit = unit if unit in units else unit + "s" if unit + "s" in units else unit
    return n * units.get(unit, 1.0)


def step_number(kind: str, phase: str) -> int | None:
    """The number of ``phase`` on the path ``kind`` (``shadow``, ``in_place``, or "" while
    undecided), None for a phase that is not a step (``aborted``, ``refused``)."""
    shadow, in_place = PHASES.get(phase, (None, None))
    return in_place if kind == "in_place" else shadow


@dataclass
class Migration:
    id: str
    query: str
    new_plan: str  # path of the new plan as recorded in the store
    old_instance: str
    new_instance: str = ""
    generation: int = 0
    strategy: str = "auto"  # auto | in-place | shadow
    cut_mode: str = "control-events"  # control-events | offsets
    require: list[str] = field(default_factory=list)
    compare: bool = False
    reconcile: str = "off"  # auto | on | off, as asked
    reconciling: bool = False  # decided in step 1
    side_from: dict[str, int] = field(default_factory=dict)  # side topic offsets at step 2
    counts: dict[str, Any] = field(default_factory=dict)  # the reconciliation's
    phase: str = "check"
    kind: str = ""  # in_place | shadow, decided in step 1
    verdict: str = ""
    high: dict[str, dict[str, int]] = field(default_factory=dict)
    cut: dict[str, dict[str, int]] = field(default_factory=dict)
    epoch: int = 0
    history: list[list[Any]] = field(default_factory=list)
    bootstrap: str = ""
    master: str = "local[2]"
    trigger: str = "1 second"
    error: str | None = None
    #: what the checkpoint check said before an in-place restart (``checkpoint.restart``
    #: of ``theseus check --query``): outcome and reason, "" when it did not run
    checkpoint: str = ""
    #: the cascade this migration is part of (``migrate.cascade``), "" alone
    cascade: str = ""
    #: the downstream migrations of the cascade fed by this query's output (this one
    #: propagates its cut into its output topic)
    feeds: list[str] = field(default_factory=list)
    #: the upstream migration whose propagated control events are this migration's cut
    cut_from: str = ""
    #: the propagated cut: this migration's control events in its output topic
    out_cut: dict[str, dict[str, int]] = field(default_factory=dict)
    #: where the shadow's output before the cut ends in ``<output>.shadow`` (an upstream's)
    side_end: dict[str, int] = field(default_factory=dict)
    #: a plan with a recursive step: where each side's (``old``, ``new``) output query is
    #: cut, recorded in step 5 once its loop acknowledged C: the control events written
    #: into the loop's internal topic (C' for the old query, C'' for the shadow); for a
    #: side without recursion, C on its source topics
    output_cuts: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)

    def save(self, store: DirectoryStore, deadline: Deadline | None = None) -> None:
        atomic_write(store.migration_path(self.id), json.dumps(asdict(self), indent=2) + "\n")
        atomic_write(store.query_dir(self.query) / "migration", self.id)
        store.flush(deadline)  # recorded where every host reads it, before anyone acts on it

    @classmethod
    def load(cls, store: DirectoryStore, migration_id: str) -> Migration:
        return load_record(cls, store, store.migration_path(migration_id), "migration",
                           migration_id)


def load_record(cls: Any, store: DirectoryStore, path: Path, kind: str, record_id: str) -> Any:
    """A record of the store (a migration, a cascade) as its dataclass ``cls``: one clear
    error when it is missing or does not have the dataclass's fields."""
    try:
        doc = read_json(path, f"{kind} record")
    except FileNotFoundError:
        raise MigrationError(f"no {kind} '{record_id}' in the store",
                             file=str(store.root)) from None
    try:
        return cls(**doc)
    except TypeError as e:
        raise StoreError(f"malformed {kind} record", file=str(path),
                         expected=f"the fields of a {kind}", found=str(e)) from None


def current(store: DirectoryStore, query: str) -> Migration:
    p = store.query_dir(query) / "migration"
    if not p.exists():
        raise MigrationError(f"query '{query}' has no migration", file=str(store.root),
                             expected="a migration started with theseus migrate start",
                             found="none")
    return Migration.load(store, p.read_text().strip())


def _offsets_json(offsets: dict[str, dict[int, int]]) -> dict[str, dict[str, int]]:
    return {t: {str(p): int(o) for p, o in ps.items()} for t, ps in offsets.items()}


def _offsets(doc: dict[str, dict[str, int]]) -> dict[str, dict[int, int]]:
    return {t: {int(p): int(o) for p, o in ps.items()} for t, ps in doc.items()}


def check_cut(high: dict[str, dict[int, int]], cut: dict[str, dict[int, int]]) -> None:
    """The cut C must cover every partition of the high watermarks H, at or beyond H: both
    queries were paused at H, and a control event lands after everything written before it.
    A cut behind H means the topic was deleted and created again since the pause (or a bug):
    refuse, naming the topic, the partition and both offsets."""
    for t, parts in sorted(high.items()):
        for p, h in sorted(parts.items()):
            c = cut.get(t, {}).get(p)
            if c is None:
                raise MigrationError(f"topic '{t}' partition {p}: the cut C misses a "
                                     "partition of the high watermarks H",
                                     expected=f"C at offset {h} or later (H)", found="none")
            if c < h:
                raise MigrationError(f"topic '{t}' partition {p}: the cut C is behind the "
                                     "high watermark H (the topic was deleted and created "
                                     "again since the pause?)",
                                     expected=f"C at offset {h} or later (H)",
                                     found=f"C at offset {c}")


def has_recursion(plan: Plan) -> bool:
    return any(isinstance(n, Recursive) for n in plan.nodes.values())


def recursion_problem(plan: Plan) -> tuple[str, str, str] | None:
    """Why a live migration cannot cut a plan with recursion (node, JSON pointer, reason),
    None when it can: the plan has at most one recursive step, and its output query (the
    steps after the recursion and the sink) reads no stream but the loop's internal topic.
    The cut of the output query is then the control events written into that topic once
    the loop finished the input before C (step 5); a second loop, or a stream the output
    query reads directly, would need a cut of its own that this protocol does not make."""
    recs = sorted(nid for nid, n in plan.nodes.items() if isinstance(n, Recursive))
    if len(recs) > 1:
        return (recs[1], plan.pointer(recs[1]),
                f"{len(recs)} recursive steps ({', '.join(recs)}): each loop's internal "
                "topic would need its own cut, and one loop may read another's; one "
                "recursive step per plan migrates live")
    if not recs:
        return None
    seen: set[str] = set()
    todo = [plan.sink_id]
    while todo:
        nid = todo.pop()
        if nid in seen:
            continue
        seen.add(nid)
        node = plan.nodes[nid]
        if isinstance(node, Recursive):
            continue  # the output query reads its internal topic, not its inputs
        if isinstance(node, Source) and table_read(node) != SNAPSHOT:
            return (nid, plan.pointer(nid),
                    f"the steps after recursive step '{recs[0]}' also read the stream "
                    f"source '{nid}' directly: the output query would need a cut in "
                    f"'{node.topic}' besides the one in the loop's internal topic")
        todo.extend(node.inputs)
    return None


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child counts as dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return True


def last_error_line(log: Path) -> str:
    """The last line of a query host's log that is not librdkafka's (``%3|...``) or
    Spark's progress: what ``theseus run`` said when it exited."""
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return "no log"
    said = [ln.strip() for ln in lines
            if ln.strip() and not ln.startswith("%") and not ln.startswith("  batch ")]
    return said[-1][:500] if said else "its log is empty"


class Migrator:
    """Drives one migration through its phases; ``echo`` prints lines that stay (the
    phases), ``live`` the line that follows the shadow (:mod:`migrate.progress`: one line
    rewritten in place on a terminal; by default plain lines, at most one every 10 s)."""

    def __init__(self, store: DirectoryStore, m: Migration,
                 echo: Callable[[str], None] = print, timeout: float = 600.0,
                 lag_threshold: int = 2000, steady_batches: int = 6,
                 deadline: Deadline | None = None,
                 live: Callable[[str, str], None] | None = None) -> None:
        self.store = store
        self.m = m
        self.echo = echo
        if live is None:
            from migrate.progress import Progress

            plain = Progress(tty=False)
            plain._write = lambda text: echo(text.rstrip("\n"))  # type: ignore[method-assign]
            live = plain.live
        self.live = live
        # One time budget shared by every Kafka/Spark wait of this run.
        self.deadline = deadline or Deadline(timeout, hint=self.resume_hint())
        self.lag_threshold = lag_threshold
        self.steady_batches = steady_batches
        #: a cascade's driver hands each downstream its upstream's migrator (one record in
        #: memory per migration: what one writes, the other reads)
        self.up: Migrator | None = None
        #: a cascade's upstream: the producer of the propagated cut's control events,
        #: created while the old query finishes (gates.control.control_producer)
        self.control: Any = None

    # -- helpers --------------------------------------------------------------------------
    def resume_hint(self) -> str:
        q = self.m.query
        return (f"theseus migrate resume {q} continues from here; theseus migrate abort {q} "
                "rolls back")

    def save(self) -> None:
        self.m.save(self.store, self.deadline)

    def flush(self) -> None:
        self.store.flush(self.deadline)

    def enter(self, phase: str) -> None:
        """Record a phase before acting on it."""
        self.m.phase = phase
        self.m.history.append([phase, round(time.time(), 3)])
        self.save()
        n = step_number(self.m.kind, phase)
        self.echo(f"[{self.m.id}] {phase}" if n is None else f"[{self.m.id}] {n}. {phase}")
        fault = os.environ.get("THESEUS_FAULT")  # tests: die right after recording a phase
        if fault == f"after:{phase}":
            os.kill(os.getpid(), signal.SIGKILL)

    def mark(self, name: str) -> None:
        """Note in the history (saved with the next record) when a moment of a step that is
        not a phase happened: where a benchmark finds where the time goes."""
        self.m.history.append([name, round(time.time(), 3)])

    def wait(self, what: str, cond: Callable[[], bool], interval: float = 0.2,
             show: bool = True) -> None:
        """Poll ``cond`` until true; the deadline running out raises DeadlineExceeded.
        ``show``: say on the live line what is awaited, once it takes a second."""
        t0 = self.deadline.remaining()
        while not cond():
            self.check_alive()
            waited = t0 - self.deadline.remaining()
            if show and waited >= 1:
                self.live(f"  waiting for {what} ({waited:.0f} s)", f"wait {what}")
            self.deadline.sleep(interval, what)

    def check_alive(self, always: bool = False) -> None:
        """A query that failed will never reach H or C: say so now, with its error and log,
        instead of waiting for the deadline. ``always``: whatever the phase (a cascade's
        upstream past its propagation, whose shadow must still reach the cut)."""
        if self.m.kind != "shadow" or not self.m.new_instance or (not always and (
                self.m.phase not in ("shadow", "pause", "cut", "align", "propagate"))):
            return
        from migrate.run import failure_message

        q = self.m.query
        for inst, which, hint in (
                (self.m.new_instance, "shadow", "fix the cause, then theseus migrate abort "
                 f"{q} (the old query keeps running) and start again"),
                (self.m.old_instance, "old", "fix the cause, restart it with theseus run (its "
                 f"checkpoint keeps its place), then theseus migrate resume {q}; or theseus "
                 f"migrate abort {q}")):
            st = self.store.status(inst)
            if st.get("status") == "failed":
                first = failure_message(str(st.get("error") or "see its log"))[:500]
                raise MigrationError(f"the {which} query '{inst}' failed: {first}",
                                     file=str(self.store.log_path(inst)), hint=hint)
            if which == "shadow" and self.exited(st):
                # The process the migrator started is gone without recording why (it
                # failed before its query started, or was killed): nothing will restart it.
                # (A dead old query is left alone: its host may restart it on its
                # checkpoint, and the migration then goes on.)
                raise MigrationError(
                    f"the shadow query '{inst}' exited before it ran: "
                    f"{last_error_line(self.store.log_path(inst))}",
                    file=str(self.store.log_path(inst)), hint=hint)

    @staticmethod
    def exited(st: dict[str, Any]) -> bool:
        """A status that says starting or running, of a process on this host that is gone."""
        import socket

        return st.get("status") in ("starting", "running") and bool(st.get("pid")) and \
            st.get("host", socket.gethostname()) == socket.gethostname() and \
            not _pid_alive(int(st["pid"]))

    def plans(self) -> tuple[Plan, Plan]:
        old = load_plan(str(self.store.plan_path(self.m.old_instance)))
        new = load_plan(self.m.new_plan)
        return old, new

    def source_topics(self, plan: Plan) -> list[str]:
        """The stream sources' topics: the cut, the caps and the acks are about these.

        A table read as a snapshot (latest value per key) is read whole at every batch, so it
        has no position to cap; its topic is left alone.  A table read as a changelog is a
        stream of its changes: it is cut like a stream."""
        return sorted({n.topic for n in plan.nodes.values()
                       if isinstance(n, Source) and table_read(n) != SNAPSHOT})

    def high_watermarks(self, topics: list[str]) -> dict[str, dict[int, int]]:
        return watermarks(self.m.bootstrap, topics, self.deadline)

    def low_watermarks(self, topics: list[str]) -> dict[str, dict[int, int]]:
        return watermarks(self.m.bootstrap, topics, self.deadline, low=True)

    def set_gate(self, instance: str, mode: str, cap: dict[str, dict[int, int]] | None = None,
                 follow: str | None = None, retire: str | None = None) -> int:
        self.m.epoch += 1
        self.save()
        write_gate(self.store.root, instance,
                   GateState(mode, cap or {}, self.m.epoch, follow, retire))
        self.flush()
        return self.m.epoch

    def spawn(self, plan_path: str, instance: str, generation: int, gated: bool) -> int:
        st = self.store.status(instance)
        if st.get("status") in ("starting", "running") and _pid_alive(st.get("pid")):
            return int(st["pid"])  # resumed: it is already up
        log = open(self.store.log_path(instance), "ab")
        cmd = [sys.executable, "-m", "migrate.cli", "run", plan_path, "--bootstrap",
               self.m.bootstrap, "--state", self.store.spec, "--instance", instance,
               "--generation", str(generation), "--master", self.m.master,
               "--trigger", self.m.trigger, *kafkaconf.cli_args()]
        if gated:
            cmd.append("--gated-start")
            if self.side_topic_used():
                cmd += ["--shadow-topic", self.compare_topic()]
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        self.store.set_status(instance, status="starting", pid=proc.pid)
        return proc.pid

    def upstream(self) -> Migrator:
        """The migration of the query that feeds this one in a cascade (the driver's own
        when a driver runs both)."""
        if self.up is not None and self.up.m.id == self.m.cut_from:
            return self.up
        return Migrator(self.store, Migration.load(self.store, self.m.cut_from), self.echo,
                        deadline=self.deadline, live=self.live)

    def fed_topic(self) -> str:
        """The topic through which the upstream of a cascade feeds this query."""
        return self.upstream().plans()[1].sink.topic

    def side_topic_used(self) -> bool:
        """The shadow writes its output before the cut to ``<output>.shadow``: with
        --compare, to reconcile, and for the downstream shadows of a cascade."""
        return self.m.compare or self.m.reconciling or bool(self.m.feeds)

    def compare_topic(self) -> str:
        """``<output>.shadow``: where the shadow writes until the cutover with --compare."""
        return f"{self.plans()[1].sink.topic}.shadow"

    def reconcile_spec(self) -> dict[str, Any] | None:
        """What the shadow's start gate says about reconciliation (gates.reconcile)."""
        if not self.m.reconciling:
            return None
        return {"topic": self.compare_topic(), "from": self.m.side_from,
                "migration": self.m.id}

    def tombstone_controls(self) -> None:
        """The migration is over: its control records need not stay in compacted topics
        (in the source topics, and the output topic of a cascade's upstream)."""
        if self.m.cut_mode != "control-events" or not (self.m.cut or self.m.out_cut):
            return
        from gates.control import tombstone_control_events

        # a downstream's cut is its upstream's control events (the upstream tombstones
        # them); one in the middle of a chain still propagated its own into its output
        where = {**({} if self.m.cut_from else _offsets(self.m.cut)),
                 **_offsets(self.m.out_cut)}
        if not where:
            return
        n = tombstone_control_events(self.m.bootstrap, self.m.id, where,
                                     deadline=self.deadline)
        self.echo(f"  tombstoned the control records' key in {n} partition(s)")

    def delete_side_topic(self) -> None:
        """The side topic served the reconciliation only (kept with --compare, for reading)."""
        if not (self.m.reconciling or self.m.feeds) or self.m.compare:
            return
        from confluent_kafka.admin import AdminClient

        topic = self.compare_topic()
        admin = AdminClient(client_conf(self.m.bootstrap))
        timeout = self.deadline.timeout(f"the side topic '{topic}' to be deleted")
        try:
            admin.delete_topics([topic], request_timeout=timeout)[topic].result(timeout)
            self.echo(f"  deleted the side topic {topic}")
        except Exception as e:  # already gone (a resumed run), or the broker refused
            if "UNKNOWN_TOPIC" not in str(e):
                self.echo(f"  could not delete the side topic {topic}: {e}")

    def wait_shadow_stopped(self, seconds: float = 30.0) -> None:
        """After an abort: a shadow still writing would create its side topic again
        (auto-creation), and a downstream one still reading it would fail."""
        inst = self.m.new_instance
        if not inst or inst == self.m.old_instance:
            return
        wait = self.deadline.within(seconds)
        while not wait.expired() and not self.stopped(inst):
            time.sleep(0.2)

    def drop_side_topic(self) -> None:
        """The side topic of an aborted migration (reconciling, or feeding a cascade)."""
        if (self.m.reconciling or self.m.feeds) and self.m.new_instance:
            self.wait_shadow_stopped()
            self.delete_side_topic()

    def ensure_topic(self, topic: str, partitions: int,
                     config: dict[str, str] | None = None) -> None:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient(client_conf(self.m.bootstrap))
        what = f"the broker {self.m.bootstrap} to list its topics"
        try:
            if topic in admin.list_topics(timeout=self.deadline.timeout(what)).topics:
                return
        except KafkaException as e:
            self.deadline.check(what)
            raise MigrationError(f"cannot list the broker's topics: {e}",
                                 file=self.m.new_plan, found=self.m.bootstrap) from None
        what = f"the comparison topic '{topic}' to be created"
        timeout = self.deadline.timeout(what)
        # -1: the cluster's default replication factor
        fut = admin.create_topics([NewTopic(topic, partitions, -1, config=config or {})],
                                  request_timeout=timeout)[topic]
        try:
            fut.result(timeout)
        except Exception as e:  # created concurrently (a resumed run) is fine
            if "TOPIC_ALREADY_EXISTS" not in str(e):
                self.deadline.check(what)
                raise MigrationError(f"cannot create the comparison topic {topic}: {e}",
                                     file=self.m.new_plan) from None

    def running(self, instance: str) -> bool:
        st = self.store.status(instance)
        return st.get("status") == "running" and _pid_alive(st.get("pid"))

    def stopped(self, instance: str) -> bool:
        st = self.store.status(instance)
        return st.get("status") in ("stopped", "failed") or not _pid_alive(st.get("pid"))

    def acked(self, instance: str) -> dict[str, dict[int, int]]:
        """What ``instance``'s sources acknowledged (nothing when unreadable)."""
        try:
            return acked_offsets(self.store.root, instance)
        except GateStateError:
            return {}

    # -- the protocol -------------------------------------------------------------------
    def run(self) -> Migration:
        if self.m.kind == "in_place" and self.m.phase == "cutover":
            self.m.phase = "in_place"  # recorded before the in-place path had its own phase
        while self.m.phase not in TERMINAL:
            self.step()
        return self.m

    def step(self) -> None:
        """Run the step of the recorded phase: one phase (a cascade interleaves the phases
        of its migrations, :mod:`migrate.cascade`)."""
        steps = {"check": self.step_check, "in_place": self.step_in_place,
                 "shadow": self.step_shadow, "pause": self.step_pause, "cut": self.step_cut,
                 "align": self.step_align, "propagate": self.step_propagate,
                 "cutover": self.step_cutover, "finish": self.step_finish}
        phase = self.m.phase
        try:
            steps[phase]()
        except DeadlineExceeded as e:
            n = step_number(self.m.kind, phase)
            e.message = f"step {n} ({phase}) of migration {self.m.id}: {e.message}"
            e.args = (e.render(),)
            raise
        except MigrationError:
            raise
        except RuntimeFailure as e:
            # Kafka, the store or a gate failed under this step: one message that says
            # which step, what failed, and that the recorded phase can be resumed.
            n = step_number(self.m.kind, phase)
            self.m.error = e.render()
            self.save()
            raise MigrationError(f"step {n} ({phase}) of migration {self.m.id} failed: "
                                 f"{e.render()}", hint=self.resume_hint()) from e

    def step_check(self) -> None:
        """Step 1. Check the upgrade; refuse what cannot be done live."""
        self.enter("check")
        old, new = self.plans()
        report = check_plans(old, new, require=self.m.require)
        self.m.verdict = report.verdict
        if report.verdict == "unsupported":
            self.m.phase = "refused"
            self.m.error = "; ".join(f"[{f.code}] {f.message}" for f in report.findings
                                     if f.effect == "unsupported")
            self.save()
            raise MigrationError("the checker says this upgrade is unsupported: " +
                                 self.m.error, file=self.m.new_plan,
                                 hint="see theseus check for every finding")
        if self.m.strategy == "in-place" and report.verdict == "migrate":
            raise MigrationError("--strategy in-place, but the state is incompatible",
                                 file=self.m.new_plan, expected="in_place or identical",
                                 found=report.verdict)
        shadow = self.m.strategy == "shadow" or (self.m.strategy == "auto" and
                                                  report.verdict == "migrate")
        if not shadow and self.m.reconcile == "on":
            if self.m.strategy == "in-place":
                raise MigrationError("--reconcile on needs a shadow that recomputes every key "
                                     "over the history; an in-place restart cannot",
                                     file=self.m.new_plan, expected="--strategy auto or shadow",
                                     found="--strategy in-place")
            shadow = True  # only a shadow knows the new plan's value for every key
        agrees = self.checkpoint_agrees() if not shadow else True
        if agrees is None:
            # Nothing says what Spark would do on the checkpoint: auto never restarts into
            # a failure, so it migrates through a shadow (a fresh checkpoint); in-place,
            # asked for explicitly, restarts with a warning.
            if self.m.strategy == "in-place":
                self.echo(f"theseus: warning: the checkpoint was not verified "
                          f"({self.m.checkpoint.removeprefix('not verified: ')}): "
                          "restarting in place on the plan check alone, as "
                          "--strategy in-place asks")
            else:
                self.echo(f"theseus: the checkpoint cannot be verified from this host "
                          f"({self.m.checkpoint.removeprefix('not verified: ')}): migrating "
                          "through a shadow query instead of restarting in place on the "
                          "plan check alone (run the migration on the query's host to "
                          "restart in place)")
                shadow = True
        if not shadow and agrees is False:
            # The checkpoint contradicts the plan check: an in-place restart would fail or
            # run on wrong state.  auto falls back to a shadow (a fresh checkpoint).
            if self.m.strategy == "in-place":
                self.m.phase = "refused"
                self.m.error = self.m.checkpoint
                self.save()
                raise MigrationError("--strategy in-place, but the checkpoint contradicts "
                                     "the plan check: " + self.m.checkpoint,
                                     file=self.m.new_plan,
                                     hint="use --strategy auto or shadow (a live migration "
                                          "on a fresh checkpoint)")
            self.echo(f"theseus: the checkpoint contradicts the plan check "
                      f"({self.m.checkpoint}): migrating through a shadow query instead")
            shadow = True
        if not shadow and report.verdict == "in_place" and \
                old.info[old.sink.id].changelog:
            # Over a changelog, a restart on the checkpoint sends the retractions of rows
            # written under the old plan through the new steps: a stricter filter drops the
            # retraction of a row it would not have kept, so the old row stays in the output
            # for good, and a changed step upstream of a table aggregate or join subtracts
            # what was never added.  Only a fresh state (a shadow) and the reconciliation at
            # the cut give the new plan's rows; --strategy in-place is refused rather than
            # restarted into a wrong output.
            if self.m.strategy == "in-place":
                self.m.phase = "refused"
                self.m.error = ("the query reads tables as changelogs: a restart on the "
                                "checkpoint would retract rows the new plan never wrote, and "
                                "keep rows it would not write")
                self.save()
                raise MigrationError("--strategy in-place, but " + self.m.error,
                                     file=self.m.new_plan, expected="--strategy auto or shadow",
                                     found="--strategy in-place",
                                     hint="a shadow starts on a fresh state and reconciles "
                                          "the output's keys at the cut")
            self.echo("theseus: the query reads tables as changelogs: a restart on the "
                      "checkpoint would retract rows the new plan never wrote; migrating "
                      "through a shadow query (fresh state, reconciled at the cut) instead")
            shadow = True
        self.m.kind = "shadow" if shadow else "in_place"
        if shadow:
            self.refuse_recursion(old, new)
        self.require_access(new, shadow)
        if shadow:
            self.m.reconciling = self.decide_reconcile(new, old)
            self.require_history(new)
        self.m.phase = "shadow" if shadow else "in_place"
        self.save()

    def refuse_recursion(self, old: Plan, new: Plan) -> None:
        """Step 1 of a shadow migration where a plan has a recursive step: refuse, with the
        reason, what the cut through a loop's internal topic (step 5) does not cover."""
        why = None
        for label, plan, path in (("old", old, str(self.store.plan_path(self.m.old_instance))),
                                  ("new", new, self.m.new_plan)):
            problem = recursion_problem(plan)
            if problem is not None:
                node, pointer, reason = problem
                self.m.phase = "refused"
                self.m.error = f"the {label} plan: {reason}"
                self.save()
                raise MigrationError("a live migration of this recursive query is not "
                                     f"supported: {reason}", file=path, node=node,
                                     pointer=pointer, expected="one recursive step whose "
                                     "loop is the only stream the output query reads",
                                     found=reason, hint="run the new plan as a new query on "
                                     "a new output topic")
        if not has_recursion(old) and not has_recursion(new):
            return
        if self.m.cascade or self.m.feeds or self.m.cut_from:
            why = ("a cascade with a recursive query: the cut would have to pass through the "
                   "loop's internal topic and the queries' shared topic in one chain")
        elif has_recursion(old) and not self.store.status(self.m.old_instance).get("loops"):
            why = (f"the old query '{self.m.old_instance}' was started by a theseus that "
                   "does not record its loop query's gate: restart it with theseus run "
                   "(its checkpoint keeps its place), then migrate")
        if why is not None:
            self.m.phase = "refused"
            self.m.error = why
            self.save()
            raise MigrationError(f"refused: {why}", file=self.m.new_plan,
                                 expected="a single query with one recursive step",
                                 found=why)

    def checkpoint_agrees(self) -> bool | None:
        """Step 1 (before an in-place restart). Check the new plan against the running
        query's checkpoint (``theseus check --query``): False when Spark would refuse to
        restart on it or would restart on wrong state; None when it cannot be read from
        this host (on another host, a non-local URI such as ``s3a://``, none recorded), so
        nothing says what Spark would do; ``m.checkpoint`` says why."""
        from compat.checkpoint import CheckpointError
        from migrate.ckcheck import check_checkpoint, local_checkpoint

        st = self.store.status(self.m.old_instance)
        ck, why = local_checkpoint(st)
        if ck is None:
            self.m.checkpoint = f"not verified: {why}"
            return None
        if not os.path.isdir(ck):
            # on the query's own host, never written: a restart starts afresh
            self.m.checkpoint = f"not verified: no checkpoint directory yet ({ck})"
            return True
        try:
            report = check_checkpoint(None, self.m.new_plan, query=self.m.query,
                                      state=self.store.spec, require=self.m.require)
        except CheckpointError as e:
            if "no committed batch" in e.message:
                self.m.checkpoint = "not verified: " + e.render()
                return True  # nothing committed: a restart starts afresh anyway
            self.m.checkpoint = "unreadable checkpoint: " + e.render()
            return False
        restart = report.checkpoint["restart"] if report.checkpoint else None
        if restart is None:
            return True
        self.m.checkpoint = f"{restart['outcome']}" + \
            (f" ({restart['error_class']})" if restart["error_class"] else "") + \
            f": {restart['reason']}"
        return restart["outcome"] == "starts"

    def decide_reconcile(self, new: Plan, old: Plan | None = None) -> bool:
        """``--reconcile``: ``auto`` is on for a keyed ``update`` sink and off otherwise;
        ``on`` refuses an output it cannot reconcile, with the reason."""
        asked = self.m.reconcile
        if asked == "off":
            return False
        sink = new.sink
        why = None
        if self.m.feeds:
            why = ("the output feeds the downstream queries of the cascade, whose new queries "
                   "read the new plan's output over all input: a correction would reach them "
                   "twice")
        elif has_recursion(new) or (old is not None and has_recursion(old)):
            why = ("a plan with a recursive step: the corrections at the cut are not built "
                   "for an output query behind a loop (keys without input after the cut keep "
                   "the old plan's value)")
        elif sink.mode == "complete":
            why = ("a complete sink rewrites its whole result at every batch; a key it drops "
                   "is never deleted, and a correction is not a row of it")
        elif not sink.key_columns:
            why = "the sink has no key columns: a compacted view has no keys to correct"
        else:
            # a snapshot-read table is read whole at every batch whatever its offsets; a
            # table read as a changelog is read from its starting offsets, like a stream
            late = sorted(n.id for n in new.nodes.values() if isinstance(n, Source)
                          and table_read(n) != SNAPSHOT and n.starting_offsets != "earliest")
            if late:
                why = (f"source(s) {', '.join(late)} start at the latest offsets: the shadow "
                       "would not see every key, and would tombstone keys it never saw")
        if why is not None:
            if asked == "on":
                self.m.phase = "refused"
                self.m.error = f"--reconcile on: {why}"
                self.save()
                raise MigrationError(f"cannot reconcile the output: {why}",
                                     file=self.m.new_plan, node=sink.id,
                                     expected="a keyed update or append sink fed from the "
                                     "earliest offsets", found=f"mode {sink.mode}, key "
                                     f"{list(sink.key_columns)}", hint="--reconcile off "
                                     "leaves keys without input after the cut as they are")
            self.echo(f"  no reconciliation: {why}")
            return False
        if asked == "auto" and sink.mode != "update":
            return False
        self.echo(f"  reconciliation at the cut: on ({asked})")
        return True

    def require_access(self, new: Plan, shadow: bool) -> None:
        """Refuse, before the shadow starts or a control event is written, when the user
        (``--kafka-config``) may not do what the migration needs on some topic."""
        from gates.broker import check_access
        from migrate.run import plan_access

        needs = plan_access(new)
        if shadow and self.m.cut_mode == "control-events":
            old = self.plans()[0]
            needs += [(t, "WRITE", "receives the migration's control events (the cut)")
                      for t in sorted(set(self.source_topics(old)) |
                                      set(self.source_topics(new)))]
        try:
            check_access(self.m.bootstrap, needs, self.deadline)
        except BrokerError as e:
            self.m.phase = "refused"
            self.m.error = e.render()
            self.save()
            raise MigrationError(f"refused: {e.render()}", file=self.m.new_plan) from None

    def require_history(self, new: Plan) -> None:
        """A stateful shadow recomputes its state from the earliest offsets, and a
        reconciling one must see every key: refuse when retention already deleted part of
        that history."""
        if not self.m.reconciling and not any(i.stateful for i in new.info.values()):
            return  # a plan without state needs no history
        low = self.low_watermarks(self.source_topics(new))
        lost = {t: ps for t, ps in low.items() if any(o > 0 for o in ps.values())}
        if lost:
            shown = "; ".join(f"{t}: " + ", ".join(f"partition {p} from offset {o}"
                                                    for p, o in ps.items())
                              for t, ps in lost.items())
            self.m.phase = "refused"
            self.m.error = f"history deleted by retention (earliest available: {shown})"
            self.save()
            raise MigrationError("the new plan is stateful and needs the source history "
                                 "from offset 0, but retention deleted part of it",
                                 file=self.m.new_plan, expected="earliest offsets 0",
                                 found=f"earliest available offsets: {shown}")

    def step_in_place(self) -> None:
        """Step 2 (in place). Stop the query between batches, restart it on the same
        checkpoint with the new plan."""
        self.enter("in_place")
        q = self.m.old_instance
        # Resumed after a crash: a restart this step began may still be starting up (it
        # clears stop requests as it starts), or may already run the new plan.
        self.wait(f"'{q}' to finish starting", lambda: not self.starting(q))
        if not (self.running(q) and self.runs_new_plan(q)):
            self.store.request_stop(q)
            self.wait(f"'{q}' to stop", lambda: self.stopped(q))
            gen = int(self.store.status(q).get("generation", 0))
            self.store.clear_stop(q)
            self.spawn(self.m.new_plan, q, gen, gated=False)
        self.wait(f"'{q}' to restart on the new plan", lambda: self.running(q))
        self.m.phase = "finish"
        self.save()

    def starting(self, instance: str) -> bool:
        st = self.store.status(instance)
        return st.get("status") == "starting" and _pid_alive(st.get("pid"))

    def runs_new_plan(self, instance: str) -> bool:
        """The plan ``instance`` records it runs is the new plan (``theseus run`` records
        the plan it loaded, serialized)."""
        from compat.serde import dumps

        try:
            running = self.store.plan_path(instance).read_text(encoding="utf-8")
        except FileNotFoundError:
            return False
        return running == dumps(load_plan(self.m.new_plan))

    def step_shadow(self) -> None:
        """Step 2. Start the shadow: new instance, fresh checkpoint, start gate closed."""
        self.enter("shadow")
        inst = self.m.new_instance
        side = self.compare_topic()
        if self.side_topic_used():
            # compacted when it serves the reconciliation only: its last value per key is
            # all that is read (a cascade's downstream shadow reads every record)
            self.ensure_topic(side, 1, None if self.m.compare or self.m.feeds else
                              {"cleanup.policy": "compact"})
            self.echo(f"  shadow output before the cut goes to {side}")
        if (self.m.reconciling or self.m.feeds) and not self.m.side_from:
            # where this shadow's output starts: what an earlier migration left is not ours
            self.m.side_from = {str(p): o for p, o in self.high_watermarks([side])[side].items()}
            self.save()
        write_start_gate(self.store.root, inst, False, self.m.id,
                         reconcile=self.reconcile_spec())
        if read_gate(self.store.root, inst).mode != "open" and not self.m.cut:
            write_gate(self.store.root, inst, GateState("open", {}, self.m.epoch))
        if self.m.cut_from and not self.m.cut:
            # a cascade's downstream shadow reads the upstream shadow's output before the
            # upstream's cut first (gates.cascade): where it is, and where it starts
            up = self.upstream()
            topic, side = self.fed_topic(), up.compare_topic()
            if not up.m.side_from:
                raise MigrationError(f"the upstream migration {up.m.id} has not started its "
                                     "shadow", file=str(self.store.root),
                                     hint=self.resume_hint())
            from gates.cascade import write_switch

            write_switch(self.store.root, inst, topic=topic, side=side,
                         side_from={int(p): o for p, o in up.m.side_from.items()})
            self.flush()
            self.echo(f"  the shadow reads {side} (the new upstream's output before the "
                      f"cut), then {topic} from the upstream's cut")
        self.spawn(self.m.new_plan, inst, self.m.generation, gated=True)
        self.wait(f"shadow '{inst}' to start", lambda: self.running(inst))
        self.m.phase = "pause"
        self.save()

    def instance_topics(self) -> dict[str, list[str]]:
        """The source topics of each side, by the gate that caps their reading: the
        instance's own, or its loop query's for a plan with a recursive step."""
        old, new = self.plans()
        return {self.source_gate(self.m.old_instance): self.source_topics(old),
                self.source_gate(self.m.new_instance): self.source_topics(new)}

    def loops(self, instance: str) -> dict[str, dict[str, str]]:
        """The loop queries ``instance`` runs, as its host recorded them (``theseus run``):
        recursive step id -> its gate and its internal topic."""
        return dict(self.store.status(instance).get("loops") or {})

    def source_gate(self, instance: str) -> str:
        """The gate under which ``instance`` reads its source topics: its loop query's when
        it runs one (the output query behind it reads the loop's internal topic under the
        instance's own gate), else its own."""
        loops = self.loops(instance)
        return next(iter(loops.values()))["gate"] if loops else instance

    def through_loops(self) -> bool:
        """A plan of this migration has a recursive step: the cut goes through the loops."""
        return any(map(has_recursion, self.plans()))

    def output_cut(self, side: str) -> dict[str, dict[int, int]]:
        """Where the output query of ``side`` (old, new) is cut; a plan without recursion:
        at C."""
        if side in self.m.output_cuts:
            return _offsets(self.m.output_cuts[side])
        full = _offsets(self.m.cut)
        plan = self.plans()[0 if side == "old" else 1]
        return {t: full[t] for t in self.source_topics(plan)}

    def step_pause(self) -> None:
        """Step 3. Once the shadow is close to the head, cap both at H and wait for both."""
        self.enter("pause")
        if self.m.cut_from:
            self.catch_up()
            return
        per = self.instance_topics()
        topics = sorted({t for ts in per.values() for t in ts})
        inst = self.m.new_instance

        # Close to the head is not enough: the shadow must keep pace there for a few
        # batches. A shadow fresh from its backfill runs its first small batches on a cold
        # JVM (code generation, JIT), several times slower than the old query's; paused
        # then, it would reach the cut a batch late and the output would stall for it.
        steady = {"batches": 0, "at": ""}  # batches in a row near the head, and the last
        from migrate.progress import Rate, bar_line

        rate = Rate()

        src = self.source_gate(inst)  # the loop query of a recursive plan

        def keeping_up() -> bool:
            done = self.acked(src)
            high = self.high_watermarks(per[src])
            lag = {t: {p: max(0, hi - done.get(t, {}).get(p, 0)) for p, hi in parts.items()}
                   for t, parts in high.items()}
            total = sum(sum(ps.values()) for ps in lag.values())
            records = sum(sum(ps.values()) for ps in high.values())
            if total > self.lag_threshold or not self.running(inst):
                steady.update(batches=0, at="")
            else:
                if not any(h[0] == "caught_up" for h in self.m.history):
                    # the backfill ends here
                    self.m.history.append(["caught_up", round(time.time(), 3)])
                    self.save()
                at = json.dumps(done, sort_keys=True)
                if total == 0 or at != steady["at"]:  # a new batch, or idle at the head
                    steady.update(batches=steady["batches"] + 1, at=at)
            n = steady["batches"]
            speed = rate.add(records - total)
            if n:
                self.live(f"  shadow near the head: lag {total:,} records, {n} of "
                          f"{self.steady_batches} batches in a row", "steady")
            else:
                self.live("  " + bar_line(records - total, records, speed), "backfill")
            return n >= self.steady_batches

        self.wait("the shadow to catch up", keeping_up, interval=1.0, show=False)
        self.m.history.append(["steady", round(time.time(), 3)])
        high = self.high_watermarks(topics)
        self.m.high = _offsets_json(high)
        self.save()
        first = self.m.epoch + 1
        for q, ts in per.items():
            self.set_gate(q, "capped", {t: high[t] for t in ts})
        for q, ts in per.items():
            cap = {t: high[t] for t in ts}
            self.wait(f"'{q}' to reach H", lambda q=q, cap=cap: is_acked(
                self.store.root, q, cap, first))
        self.m.phase = "cut"
        self.save()

    def catch_up(self) -> None:
        """Step 3 of a cascade's downstream: no pause of its own (its cut is the upstream's,
        propagated); its shadow reads the upstream shadow's side topic: wait until it is near
        that topic's head and keeps the trigger's pace there (``steady_batches`` batches in
        a row, each planned within 1.3 trigger intervals of the one before), so that it
        switches quickly at the upstream's hand-over. A shadow fresh from its backfill runs
        its first batches on a cold JVM, slower than its trigger: cut then, each of its two
        batches of the hand-over (the side topic's tail, then the topic from the cut) would
        add to the chain's stall. A shadow that stays near the head but never keeps the pace
        (a machine too slow for the trigger) is not waited for beyond three times as many
        batches."""
        from gates.cascade import read_switch

        inst = self.m.new_instance
        sw = read_switch(self.store.root, inst) or {}
        side = sw.get("side") or self.upstream().compare_topic()
        pace = 1.3 * trigger_seconds(self.m.trigger)
        seen = {"time": None, "paced": 0, "near": 0}

        def near() -> bool:
            try:
                entry = read_ack(self.store.root, inst)["topics"].get(side) or {}
            except GateStateError:
                entry = {}
            done = {int(p): int(o) for p, o in (entry.get("offsets") or {}).items()}
            high = self.high_watermarks([side]).get(side, {})
            lag = sum(max(0, h - done.get(p, 0)) for p, h in high.items())
            at = entry.get("time")
            if not self.running(inst) or lag > self.lag_threshold:
                seen.update(paced=0, near=0)
            elif at is not None and at != seen["time"]:  # a new batch planned
                if seen["time"] is not None:
                    seen["near"] += 1
                    paced = float(at) - float(seen["time"]) <= pace
                    seen["paced"] = seen["paced"] + 1 if paced else 0
            seen["time"] = at
            self.live(f"  downstream shadow on {side}: lag {lag:,} records, "
                      f"{seen['paced']} of {self.steady_batches} batches at the trigger's "
                      "pace", "catch up")
            return seen["paced"] >= self.steady_batches or \
                seen["near"] >= 3 * self.steady_batches

        self.wait(f"the shadow '{inst}' to catch up with {side}", near, interval=0.25,
                  show=False)
        self.m.phase = "cut"
        self.save()

    def step_cut(self) -> None:
        """Step 4. Write the control events; their offsets are the cut C."""
        self.enter("cut")
        if self.m.cut_from:
            self.adopt_cut()
            return
        topics = sorted(_offsets(self.m.high))
        high = _offsets(self.m.high)
        if self.m.cut_mode == "offsets":
            cut = high
        else:
            from gates.control import write_control_events

            cut = write_control_events(self.m.bootstrap, topics, self.m.id,
                                       deadline=self.deadline)
        check_cut(high, cut)
        self.m.cut = _offsets_json(cut)
        self.save()
        self.echo("  cut C = " + json.dumps(self.m.cut))
        if self.through_loops():
            self.arm_loops(cut)
        else:
            self.arm(cut)
        self.m.phase = "align"
        self.save()

    def adopt_cut(self) -> None:
        """Step 4 of a cascade's downstream: its cut C is the control events the upstream's
        hand-over wrote into its output topic. The old query is capped there at once (the
        upstream propagates as soon as its own old query finished: the cap is read by the
        very trigger that reads the old upstream's last output, or the next). The shadow
        reads the upstream shadow's side topic to where its output before the cut ends,
        known once that shadow finished the input before the upstream's cut, then the topic
        from C. The old query must have seen its cap before the upstream's new query writes
        past C (the upstream holds that output until this step is done), so wait for its
        acknowledgement under the cap."""
        from gates.cascade import write_switch

        up = self.upstream()
        if not up.m.out_cut:
            raise MigrationError(f"the upstream migration {up.m.id} has not propagated its "
                                 f"cut (phase {up.m.phase})", file=str(self.store.root),
                                 hint=self.resume_hint())
        cut = _offsets(up.m.out_cut)
        self.m.high = up.m.out_cut
        self.m.cut = up.m.out_cut
        self.save()
        self.echo("  cut C = " + json.dumps(self.m.cut) + f" (propagated by {up.m.id})")
        topic = self.fed_topic()
        old = self.m.old_instance
        theirs = {t: cut[t] for t in self.instance_topics()[old]}
        g = read_gate(self.store.root, old)
        # resumed after the old query was capped: capped again, it would have to acknowledge
        # a new epoch, which a query that handed over (and stopped) never does
        self.arm(cut, old_too=not (g.mode == "capped" and g.cap == theirs and
                                   g.retire == self.m.id))
        capped = read_gate(self.store.root, old).epoch  # acknowledged under this cap
        self.mark("capped")
        if not up.m.side_end:
            up.note_side_end()  # the upstream shadow finished the input before its cut
        write_switch(self.store.root, self.m.new_instance, topic=topic,
                     side=up.compare_topic(),
                     side_from={int(p): o for p, o in up.m.side_from.items()},
                     side_end={int(p): o for p, o in up.m.side_end.items()}, at=cut[topic])
        self.flush()
        self.mark("switch")

        def seen() -> bool:
            # It read the cap (it may still have input before C to finish: it plans no
            # batch past C any more, and the alignment waits for the rest); or it stood at
            # C before the cap (idle, caught up: the upstream's old query retired and its
            # new one holds its output): it then handed over as soon as the cap was written
            # (gates.state.retired), its host stops it and it never acknowledges the new
            # epoch, but its sink writes nothing more.
            return saw_cap(self.store.root, old, theirs, capped) or \
                handed_over(self.store.root, old, theirs, self.m.id)

        self.wait(f"'{old}' to see the propagated cut", seen, interval=CUT_POLL)
        self.mark("seen")
        self.m.phase = "align"
        self.save()

    def step_propagate(self) -> None:
        """Step 5 of a cascade's upstream, once its old query's output before the cut is
        committed: write one control event into every partition of the output topic (the
        downstream queries' cut). Nothing else writes that topic until the cutover: the old
        query is retired at C, and the new query holds its first output from the cut
        (``hold``). Where the shadow's output before the cut ends in the side topic is
        noted once the shadow finished that input (:meth:`note_side_end`)."""
        self.enter("propagate")
        if not self.m.out_cut:
            from gates.control import write_control_events

            topic = self.plans()[1].sink.topic
            producer, self.control = self.control, None
            out = write_control_events(self.m.bootstrap, [topic], self.m.id,
                                       deadline=self.deadline, producer=producer)
            self.m.out_cut = _offsets_json(out)
            self.save()
            self.echo(f"  propagated the cut into {topic}: " + json.dumps(self.m.out_cut))
        self.m.phase = "cutover"
        self.save()

    def note_side_end(self) -> None:
        """A cascade's upstream: wait until the shadow finished the input before its cut
        (all its output before the cut is committed to the side topic), then record where
        that output ends (``side_end``: where the downstream shadows switch to the topic)."""
        inst = self.m.new_instance
        mine = self.output_cut("new")

        def done() -> bool:
            self.check_alive(always=True)
            return is_acked(self.store.root, inst, mine)

        self.wait(f"the shadow '{inst}' to reach the cut", done, interval=CUT_POLL)
        if not self.m.side_end:
            side = self.compare_topic()
            self.m.side_end = {str(p): o for p, o in
                               self.high_watermarks([side])[side].items()}
            self.save()

    def arm(self, cut: dict[str, dict[int, int]], old_too: bool = True) -> None:
        """Cap both queries at C. The shadow's cap follows the old query: its source passes C
        by itself once the old query acknowledged C, and its start gate opens for the batches
        that start at C or later, so the switch does not wait for this process. The old
        query's cap retires it: once it acknowledged C its sink writes nothing more and its
        host stops it, so it neither repeats the new query's output nor takes its CPU."""
        per = self.instance_topics()
        old, inst = self.m.old_instance, self.m.new_instance
        mine = {t: cut[t] for t in per[inst]}
        theirs = {t: cut[t] for t in per[old]}
        write_start_gate(self.store.root, inst, False, self.m.id, from_offsets=mine,
                         follow=old, follow_offsets=theirs, reconcile=self.reconcile_spec(),
                         hold=bool(self.m.feeds))
        self.flush()
        if old_too:
            self.set_gate(old, "capped", theirs, retire=self.m.id)
        self.set_gate(inst, "capped", mine, follow=old)

    def arm_loops(self, cut: dict[str, dict[int, int]]) -> None:
        """Step 4 with a recursive step: cap what reads the source topics at C (the loop
        query, or the query itself on a side without recursion). The output queries are
        cut in step 5, once the loops have finished the input before C; until then the
        shadow's start gate stays closed."""
        for gate, ts in self.instance_topics().items():
            self.set_gate(gate, "capped", {t: cut[t] for t in ts})

    def align_loops(self) -> None:
        """Step 5 with a recursive step (README, Recursion): the loop query -> internal
        topic -> output query of each side is cut like a cascade's upstream -> downstream.

        5a. The loops (a side without recursion: the query itself) finish the input before
            C: all the rows they derive from it are committed to their internal topics.
        5b. One control event into every partition of each loop's internal topic: C' is the
            old output query's cut, C'' the shadow's (a side without recursion: C).
        5c. The old output query is capped at C' (it retires there); the shadow's at C'',
            following the old one, its start gate opening from C''. Then the shadow loop's
            cap is lifted: what it derives from C on lands after C''.
        5d. Both output queries finish the input before their cuts."""
        full = _offsets(self.m.cut)
        old, inst = self.m.old_instance, self.m.new_instance
        plans = dict(zip(("old", "new"), self.plans()))
        for side, name in (("old", old), ("new", inst)):
            if side in self.m.output_cuts:
                continue  # resumed: its loop reached C and its topic is cut
            # 5a.
            gate = self.source_gate(name)
            cap = {t: full[t] for t in self.source_topics(plans[side])}
            g = read_gate(self.store.root, gate)
            if (g.mode, g.cap) != ("capped", cap):
                self.set_gate(gate, "capped", cap)  # resumed after a crash in step 4
            self.wait(f"'{gate}' to reach the cut",
                      lambda gate=gate, cap=cap: is_acked(self.store.root, gate, cap))
            # 5b.
            topics = sorted(lp["topic"] for lp in self.loops(name).values())
            if not topics:
                at = cap
            elif self.m.cut_mode == "offsets":
                # capped at C with everything before C committed, the loop writes nothing
                # more: the end of its topic stands still
                at = self.high_watermarks(topics)
            else:
                from gates.control import write_control_events

                at = write_control_events(self.m.bootstrap, topics, self.m.id,
                                          deadline=self.deadline)
            self.m.output_cuts[side] = _offsets_json(at)
            self.save()
            if topics:
                mark = "C'" if side == "old" else "C''"
                self.echo(f"  cut the {side} loop's topic: {mark} = " +
                          json.dumps(self.m.output_cuts[side]))
        # 5c.
        c_old, c_new = self.output_cut("old"), self.output_cut("new")
        write_start_gate(self.store.root, inst, False, self.m.id, from_offsets=c_new,
                         follow=old, follow_offsets=c_old)
        self.flush()
        g_old, g_new = read_gate(self.store.root, old), read_gate(self.store.root, inst)
        if (g_old.mode, g_old.cap, g_old.retire) != ("capped", c_old, self.m.id):
            self.set_gate(old, "capped", c_old, retire=self.m.id)
        if (g_new.mode, g_new.cap, g_new.follow) != ("capped", c_new, old):
            self.set_gate(inst, "capped", c_new, follow=old)
        for lp in self.loops(inst).values():
            if read_gate(self.store.root, lp["gate"]).mode != "open":
                self.set_gate(lp["gate"], "open")
        # 5d.
        for name, c in ((old, c_old), (inst, c_new)):
            self.wait(f"'{name}' to reach its cut",
                      lambda name=name, c=c: is_acked(self.store.root, name, c))
        self.m.phase = "cutover"
        self.save()

    def step_align(self) -> None:
        """Step 5. Both queries finish exactly the input before C.

        A cascade's upstream (``feeds``) waits here for its old query only: once that
        finished the input before C, its output topic T ends where the propagated cut will
        be (its new query holds its output from C until the cutover), so the control
        events go into T at once and the downstream's old query is capped there while the
        shadow is still finishing. The shadow's alignment is awaited where it is needed:
        the downstream shadow's switch (:meth:`note_side_end`) and this query's cutover."""
        self.enter("align")
        if self.through_loops():
            self.align_loops()
            return
        full = _offsets(self.m.cut)
        per = self.instance_topics()
        old, inst = self.m.old_instance, self.m.new_instance
        g_old, g_new = read_gate(self.store.root, old), read_gate(self.store.root, inst)
        if (g_old.mode, g_old.cap, g_old.retire) != (
                "capped", {t: full[t] for t in per[old]}, self.m.id) or \
                (g_new.mode, g_new.cap, g_new.follow) != (
                    "capped", {t: full[t] for t in per[inst]}, old):
            self.arm(full)  # resumed after a crash in step 4 (or a refused abort)
        if self.m.feeds and not self.m.out_cut and self.control is None:
            from gates.control import control_producer

            self.control = control_producer(self.m.bootstrap, deadline=self.deadline)
        for q, ts in per.items():
            if self.m.feeds and q == self.source_gate(inst):
                continue  # awaited by note_side_end
            cut = {t: full[t] for t in ts}
            self.wait(f"'{q}' to reach the cut",
                      lambda q=q, cut=cut: is_acked(self.store.root, q, cut),
                      interval=CUT_POLL)
        if self.m.feeds:
            self.mark("old_at_cut")
        self.m.phase = "propagate" if self.m.feeds else "cutover"
        self.save()

    def step_cutover(self) -> None:
        """Step 6. Open the shadow's start gate and lift its cap; stop the old query.

        The old query is capped at C and has acknowledged C (step 5): it cannot write
        anything more, so the shadow takes over at once and the old one stops beside it.
        This keeps the output stall to the shadow's next trigger (see bench/migrate_speed.py).
        """
        self.enter("cutover")
        old, inst = self.m.old_instance, self.m.new_instance
        if self.m.feeds:
            # A cascade's upstream holds its output until opened here; opened before its
            # shadow finished the input before C, its output before C would go to T too.
            self.note_side_end()
        else:
            self.wait(f"'{inst}' to pass the cut", lambda: self.switched(inst),
                      interval=CUT_POLL)
        write_start_gate(self.store.root, inst, True, self.m.id,
                         reconcile=self.reconcile_spec())
        self.flush()
        if self.m.feeds:
            self.mark("opened")
        self.set_gate(inst, "open")
        # The old query is capped and idle; stopping its JVM now would compete for CPU with
        # the shadow's first batches. Let the shadow commit a batch past the cut first.
        cut = self.output_cut("new")
        courtesy = self.deadline.within(30)
        while not courtesy.expired() and not self.past(inst, cut):
            time.sleep(min(0.2, courtesy.remaining()))
        self.store.request_stop(old)
        self.wait(f"'{old}' to stop", lambda: self.stopped(old))
        if self.m.reconciling:
            self.await_reconciliation()
        self.m.phase = "finish"
        self.save()

    def await_reconciliation(self) -> None:
        """The shadow's first batch from C carries the corrections; wait until they are
        committed and record their counts. A shadow host that died meanwhile (killed in
        the middle of that batch) is started again on its checkpoint: Spark replays the
        batch, whose transaction was aborted, and the corrections are written once."""
        from gates.reconcile import read_record

        inst = self.m.new_instance

        def committed() -> bool:
            rec = read_record(self.store.root, inst)
            if rec.get("state") == "committed" and rec.get("migration") == self.m.id:
                return True
            st = self.store.status(inst)
            if st.get("status") == "failed":
                from migrate.run import failure_message

                first = failure_message(str(st.get("error") or "see its log"))[:500]
                raise MigrationError(f"the shadow query '{inst}' failed while reconciling: "
                                     f"{first}", file=str(self.store.log_path(inst)),
                                     hint=f"fix the cause, then theseus migrate resume "
                                     f"{self.m.query}")
            if not self.starting(inst) and not self.running(inst):
                self.echo(f"  the shadow '{inst}' is not running: starting it again")
                self.spawn(self.m.new_plan, inst, self.m.generation, gated=True)
            return False

        self.wait("the shadow to commit the reconciliation", committed)
        rec = read_record(self.store.root, inst)
        self.m.counts = dict(rec.get("counts") or {})
        self.save()
        c = self.m.counts
        self.echo(f"  reconciled at the cut: {c.get('corrected', 0)} corrected, "
                  f"{c.get('added', 0)} added, {c.get('deleted', 0)} deleted, "
                  f"{c.get('matched', 0)} already right")

    def switched(self, instance: str) -> bool:
        """The shadow's start gate is open (it writes the output from the cut on)."""
        return StartGate(self.store.root, instance).is_open(-1, wait=False)

    def past(self, instance: str, cut: dict[str, dict[int, int]]) -> bool:
        """True once ``instance`` acknowledged input beyond ``cut`` in some partition."""
        try:
            ack = read_ack(self.store.root, instance)["topics"]
        except Exception:
            return False
        for t, parts in cut.items():
            done = ack.get(t, {}).get("offsets", {})
            if any(int(done.get(str(p), 0)) > o for p, o in parts.items()):
                return True
        return False

    def step_finish(self) -> None:
        """Step 7 (3 in place). The new plan is the query's plan; after a shadow migration
        its instance is the live one."""
        self.enter("finish")
        if self.m.kind == "shadow":
            self.store.set_live(self.m.query, self.m.new_instance)
        self.store.put_plan(self.m.query, self.new_plan_text())
        self.delete_side_topic()
        self.tombstone_controls()
        self.enter("done")

    def new_plan_text(self) -> str:
        try:
            with open(self.m.new_plan, encoding="utf-8") as f:
                return f.read()
        except OSError as e:
            raise StoreError(f"cannot read the migration's new plan: {e.strerror or e}",
                             file=self.m.new_plan) from None

    # -- rollback -----------------------------------------------------------------------
    def abort(self, drop_side: bool = True) -> Migration:
        """Roll back before the point of no return. ``drop_side``: delete the side topic
        here (a cascade deletes its side topics once every shadow of the chain stopped:
        a downstream shadow reads its upstream's)."""
        if self.m.phase in ("finish", "done"):
            raise MigrationError(f"migration {self.m.id} is past its cutover; the new plan "
                                 "is live", file=str(self.store.root),
                                 hint="migrate again to go back")
        if self.m.phase in TERMINAL:
            return self.m
        if self.m.phase == "cutover" and self.m.kind == "shadow":
            raise MigrationError("the cutover has begun: the shadow may already write the "
                                 "output from the cut on",
                                 file=str(self.store.root),
                                 hint="theseus migrate resume finishes the cutover")
        old, inst = self.m.old_instance, self.m.new_instance
        if self.m.kind == "shadow" and self.m.cut and inst:
            # Once the old query finished the input before C, the shadow's start gate
            # hands the output over: that is the point of no return. The veto is atomic
            # with the old query's acknowledgements (one lock, one file): either it comes
            # first and the shadow never writes, or abort refuses.
            theirs = self.output_cut("old")
            if self.through_loops():
                # the shadow's start gate follows the old output query from step 5c on;
                # before, it has nothing to open from
                from gates.startgate import read_start_gate

                theirs = _offsets(read_start_gate(self.store.root, inst)
                                  .get("follow_from") or {})
            if theirs and not veto(self.store.root, old, theirs, self.m.id):
                raise MigrationError("the old query finished the input before the cut: the "
                                     "shadow takes over from there", file=str(self.store.root),
                                     hint="theseus migrate resume finishes the migration")
            self.flush()
            self.set_gate(inst, "paused")
            write_start_gate(self.store.root, inst, False, self.m.id)
            self.flush()
        write_gate(self.store.root, old, GateState("open", {}, self.m.epoch + 1))
        for lp in self.loops(old).values():  # the old query's loop reads on
            write_gate(self.store.root, lp["gate"], GateState("open", {}, self.m.epoch + 1))
        if inst and inst != old:
            self.store.request_stop(inst)
            write_gate(self.store.root, inst, GateState("open", {}, self.m.epoch + 1))
            for lp in self.loops(inst).values():
                write_gate(self.store.root, lp["gate"],
                           GateState("open", {}, self.m.epoch + 1))
        self.m.epoch += 1
        # made at step 5 for the propagated cut, which an aborted migration never writes
        close_producer(self.control)
        self.control = None
        if drop_side:
            self.drop_side_topic()
        self.enter("aborted")
        self.m.phase = "aborted"
        self.save()
        try:
            self.tombstone_controls()
        except (RuntimeFailure, MigrationError) as e:  # the abort is done; they stay
            self.echo(f"  could not tombstone the control records: {e.render()}")
        return self.m


def start(store: DirectoryStore, query: str, new_plan_path: str, *, bootstrap: str,
          strategy: str = "auto", cut_mode: str = "control-events",
          require: list[str] | None = None, compare: bool = False, reconcile: str = "auto",
          master: str = "local[2]",
          trigger: str = "1 second", echo: Callable[[str], None] = print,
          timeout: float = 600.0, live: Callable[[str, str], None] | None = None
          ) -> Migration:
    m = new_migration(store, query, new_plan_path, bootstrap=bootstrap, strategy=strategy,
                      cut_mode=cut_mode, require=require, compare=compare,
                      reconcile=reconcile, master=master, trigger=trigger)
    migrator = Migrator(store, m, echo, timeout, live=live)  # the time budget starts here
    migrator.save()
    return migrator.run()


def new_migration(store: DirectoryStore, query: str, new_plan_path: str, *, bootstrap: str,
                  strategy: str = "auto", cut_mode: str = "control-events",
                  require: list[str] | None = None, compare: bool = False,
                  reconcile: str = "auto", master: str = "local[2]",
                  trigger: str = "1 second") -> Migration:
    """A new migration of the running ``query`` to the plan at ``new_plan_path`` (recorded
    in the store), not saved yet; refused when the query is unknown or already migrating."""
    running = store.live_instance(query)
    st = store.status(running)
    if not st:
        raise MigrationError(f"query '{query}' is not known to the store",
                             file=str(store.root), expected="a query started with "
                             "theseus run", found="nothing")
    try:
        prev = current(store, query)
        if prev.phase not in TERMINAL:
            raise MigrationError(f"migration {prev.id} of '{query}' is still in phase "
                                 f"{prev.phase}", file=str(store.root),
                                 hint="theseus migrate resume or abort it first")
    except MigrationError as e:
        if "has no migration" not in e.message:
            raise
    gen = int(st.get("generation", 0)) + 1
    while store.query_dir(f"{query}.g{gen}").exists() or \
            ack_path(store.root, f"{query}.g{gen}").exists():
        gen += 1  # an aborted migration's shadow: its checkpoint and acks are not ours
    mid = f"m{time.strftime('%Y%m%d%H%M%S')}-{uuid.uuid4().hex[:6]}"
    recorded = store.root / "migrations" / f"{mid}.plan.json"
    from compat.serde import dumps

    # the plan as JSON (a SQL plan compiled), as `theseus run` records the plan it runs
    atomic_write(recorded, dumps(load_plan(new_plan_path)))
    return Migration(id=mid, query=query, new_plan=str(recorded), old_instance=running,
                     new_instance=f"{query}.g{gen}", generation=gen, strategy=strategy,
                     cut_mode=cut_mode, require=list(require or []), compare=compare,
                     reconcile=reconcile, bootstrap=bootstrap, master=master,
                     trigger=trigger)


def resume(store: DirectoryStore, query: str, echo: Callable[[str], None] = print,
           timeout: float = 600.0, live: Callable[[str, str], None] | None = None
           ) -> Migration:
    m = current(store, query)
    if m.cascade:  # one migration of a chain: the chain goes on
        from migrate import cascade

        return cascade.resume(store, m.cascade, echo=echo, timeout=timeout, live=live,
                              query=query)
    if m.phase in TERMINAL:
        echo(f"migration {m.id} is {m.phase}")
        return m
    return Migrator(store, m, echo, timeout, live=live).run()


def abort(store: DirectoryStore, query: str, echo: Callable[[str], None] = print) -> Migration:
    m = current(store, query)
    if m.cascade:
        from migrate import cascade

        return cascade.abort(store, m.cascade, echo=echo, query=query)
    return Migrator(store, m, echo).abort()
