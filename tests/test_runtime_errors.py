"""Issue 11: every error a user can cause at run time (gates, store, migrator) comes through
the one exception root, names where (file/pointer or topic/partition) and expected versus
found, and ends in one line and an exit code from the CLI, never a traceback."""

from __future__ import annotations

import ast
import importlib
import json
import pickle
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from compat import errors
from compat.errors import (
    ControlError,
    GateStateError,
    MigrationError,
    SourceError,
    StoreError,
    TheseusError,
)
from tests.conftest import FIXTURES, ROOT

SHIP_LOAD = FIXTURES / "plans" / "ship_load.json"
RUNTIME_MODULES = ["gates.broker", "gates.control", "gates.deadline", "gates.files",
                   "gates.sink", "gates.source", "gates.startgate", "gates.state",
                   "migrate.kafkastore", "migrate.migration", "migrate.run", "migrate.store",
                   # the migrator's parts
                   "migrate.cascade", "migrate.context", "migrate.protocol", "migrate.record",
                   "migrate.runner", "migrate.sides", "migrate.phases.align",
                   "migrate.phases.check", "migrate.phases.cut", "migrate.phases.cutover",
                   "migrate.phases.finish", "migrate.phases.in_place", "migrate.phases.pause",
                   "migrate.phases.rollback", "migrate.phases.shadow",
                   "migrate.phases.guard", "migrate.phases.preview", "migrate.plantopics",
                   "migrate.services.arming", "migrate.services.processes",
                   "migrate.services.topics"]


def all_error_classes() -> list[type[TheseusError]]:
    out, todo = [], [TheseusError]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo.extend(cls.__subclasses__())
    return sorted(out, key=lambda c: c.__name__)


# -------------------------------------------------------------------------- the root

@pytest.mark.parametrize("module", RUNTIME_MODULES)
def test_runtime_code_raises_only_theseus_errors(module):
    """Every ``raise SomeClass(...)`` in the runtime modules raises a TheseusError."""
    mod = importlib.import_module(module)
    tree = ast.parse(Path(mod.__file__).read_text())
    raised = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and \
                isinstance(node.exc.func, ast.Name):
            raised.add(node.exc.func.id)
    for name in sorted(raised):
        cls = getattr(mod, name, None) or getattr(errors, name, None)
        assert isinstance(cls, type) and issubclass(cls, TheseusError), \
            f"{module} raises {name}, outside compat.errors.TheseusError"


def test_the_gates_error_names_are_the_roots_classes():
    from gates import control, sink, source, state

    assert control.ControlError is errors.ControlError
    assert sink.SinkError is errors.SinkError
    assert source.SourceError is errors.SourceError
    assert state.GateStateError is errors.GateStateError
    for cls in (control.ControlError, sink.SinkError, source.SourceError,
                state.GateStateError):
        assert issubclass(cls, errors.RuntimeFailure)


@pytest.mark.parametrize("cls", all_error_classes(), ids=lambda c: c.__name__)
def test_every_error_survives_pickling(cls):
    """Errors raised in Spark's Python workers may cross a process boundary pickled."""
    e = cls("it broke", file="plan.json", pointer="/nodes/0", expected="a", found="b",
            hint="do this")
    if isinstance(e, errors.GateError):
        e.topic, e.partition = "events", 2
        e.args = (e.render(),)
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is cls
    assert back.render() == e.render() and str(back) == str(e)
    assert (back.message, back.expected, back.found) == ("it broke", "a", "b")
    assert back.exit_code == e.exit_code


def test_gate_errors_point_at_topic_and_partition():
    e = ControlError("control record not delivered", topic="events", partition=2,
                     expected="a delivery report", found="Broker: Topic authorization failed")
    assert e.render() == ("topic 'events', partition 2: control record not delivered "
                          "(expected a delivery report, found Broker: Topic authorization "
                          "failed)")
    assert e.exit_code == errors.RuntimeFailure.exit_code


# -------------------------------------------------------------------------- gates

@pytest.mark.parametrize("options, expected, found", [
    ({"format": "protobuf"}, "json | string | avro", "'protobuf'"),
    ({"format": "avro", "registry": "http://r"}, "both options", "registry"),
    ({"role": "upsert"}, "stream | table | changelog", "'upsert'"),
    ({"maxRecordsPerBatch": "lots"}, "an integer", "'lots'"),
    ({"isolationLevel": "dirty"}, "read_committed | read_uncommitted", "'dirty'"),
])
def test_source_options_name_the_topic_and_what_was_expected(options, expected, found):
    from gates.source import SourceOptions

    base = {"bootstrap": "b:9092", "topic": "events", "schema": "id BIGINT"}
    with pytest.raises(SourceError) as e:
        SourceOptions.parse({**base, **options})
    assert (e.value.topic, e.value.expected, e.value.found) == ("events", expected, found)
    assert "topic 'events'" in str(e.value)


@pytest.mark.parametrize("doc, pointer, expected", [
    ({"mode": "closed"}, "/mode", "open | paused | capped"),
    ({"mode": "capped", "cap": {"t": {"0": "x"}}}, "/cap/t", "integer partitions and offsets"),
    ({"mode": "capped", "cap": ["t"]}, "/cap", "an object of topics"),
    ({"epoch": "seven"}, "/epoch", "an integer"),
    ([1, 2], "", "a JSON object"),
])
def test_a_malformed_gate_file_names_file_pointer_and_expected(tmp_path, doc, pointer,
                                                               expected):
    from gates.state import gate_path, read_gate

    p = gate_path(tmp_path, "q")
    p.parent.mkdir(parents=True)
    p.write_text(json.dumps(doc))
    with pytest.raises(GateStateError) as e:
        read_gate(tmp_path, "q")
    assert (e.value.file, e.value.pointer, e.value.expected) == (str(p), pointer, expected)


def test_unreadable_gate_and_start_gate_files_name_the_file(tmp_path):
    from gates.startgate import read_start_gate, start_gate_path
    from gates.state import gate_path, read_ack, read_gate

    for path, read in ((gate_path(tmp_path, "q"), read_gate),
                       (start_gate_path(tmp_path, "q"), read_start_gate),
                       (tmp_path / "gates" / "q.ack.json", read_ack)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{not json")
        with pytest.raises(GateStateError) as e:
            read(tmp_path, "q")
        assert e.value.file == str(path)


def test_a_corrupt_status_file_is_a_store_error_naming_it(tmp_path):
    from migrate.store import DirectoryStore

    store = DirectoryStore(tmp_path)
    p = store.query_dir("q") / "status.json"
    p.parent.mkdir(parents=True)
    p.write_text("{\"status\": ")
    with pytest.raises(StoreError) as e:
        store.status("q")
    assert e.value.file == str(p)


# -------------------------------------------------------------------------- the query host

SPARK_FAILURE = """\
[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] Failed when Python streaming data source \
perform latestOffset: Traceback (most recent call last):
  File ".../pyspark/sql/streaming/python_streaming_source_runner.py", line 279, in main
  File "/work/main/gates/source.py", line 245, in _kafka_partitions
    raise SourceError(f"{NAME}: the topic has fewer partitions than the plan says",
compat.errors.SourceError: topic 'events': theseus_kafka: the topic has fewer partitions \
than the plan says (expected 3 partitions, found 1)
 SQLSTATE: 38000
\tat org.apache.spark.sql.errors.QueryExecutionErrors$.pythonStreamingDataSourceRuntimeError
"""


def test_a_failed_query_is_reported_by_its_theseus_error_line():
    from migrate.run import failure_message

    assert failure_message(SPARK_FAILURE) == (
        "topic 'events': theseus_kafka: the topic has fewer partitions than the plan says "
        "(expected 3 partitions, found 1)")
    plain = "Job aborted.\nTraceback (most recent call last):\nValueError: bad value\n"
    assert failure_message(plain) == "bad value"
    assert failure_message("[CAST_INVALID_INPUT] oops\n\tat org.x") == \
        "[CAST_INVALID_INPUT] oops"


class _Captured:
    """PySpark's captured JVM exception as ``failure_text`` reads it: ``str()`` without the
    JVM stack trace, which it keeps in ``_stackTrace``."""

    def __init__(self, text: str, stack: str, cause: _Captured | None = None) -> None:
        self.text, self._stackTrace, self._cause = text, stack, cause

    def __str__(self) -> str:
        return self.text


AWAIT = ("Exception thrown in awaitResult: \n=== Streaming Query ===\nIdentifier: q\n"
         "Current State: ACTIVE")
AWAIT_STACK = """org.apache.spark.SparkException: Exception thrown in awaitResult: 
\tat org.apache.spark.util.SparkThreadUtils$.awaitResult(SparkThreadUtils.scala:53)
Caused by: java.util.concurrent.ExecutionException: boxed
\tat java.base/java.util.concurrent.FutureTask.report(FutureTask.java:122)
Caused by: java.io.IOException: Stream closed
\tat java.base/java.io.BufferedInputStream.getBufIfOpen(BufferedInputStream.java:168)
"""


def test_a_failure_that_says_nothing_is_reported_with_its_deepest_jvm_cause():
    from migrate.run import failure_message, failure_text

    text = failure_text(_Captured(AWAIT, AWAIT_STACK))
    # the causes right after the first line: a status error cut at 8,000 characters keeps them
    assert text.splitlines()[:3] == [
        "Exception thrown in awaitResult: ",
        "Caused by: java.util.concurrent.ExecutionException: boxed",
        "Caused by: java.io.IOException: Stream closed"]
    assert text.endswith("Current State: ACTIVE")
    assert failure_message(text) == ("Exception thrown in awaitResult: "
                                     "java.io.IOException: Stream closed")
    # as PySpark builds it for a failed query: its own frames, the chain in its cause's
    top = _Captured(AWAIT, "\tat org.apache.spark.sql.execution.streaming.X.run",
                    _Captured("Exception thrown in awaitResult: ", AWAIT_STACK))
    assert failure_text(top) == text
    # without causes, or when the first line says something, as before
    assert failure_text(_Captured(AWAIT, "")) == AWAIT
    assert failure_message(AWAIT) == "Exception thrown in awaitResult:"
    said = failure_text(_Captured("[STATE_STORE_X] bad\nmore", AWAIT_STACK))
    assert failure_message(said) == "[STATE_STORE_X] bad"
    # a Theseus error line still wins over the causes
    assert failure_message(failure_text(_Captured(SPARK_FAILURE, AWAIT_STACK))).startswith(
        "topic 'events'")


# -------------------------------------------------------------------------- the migrator

def cut_phase_store(tmp_path: Path, bootstrap: str):
    """A store whose migration of ship_load was recorded in step 4 (cut)."""
    from compat.check import load_plan
    from compat.serde import dumps
    from migrate.record import Migration
    from migrate.store import DirectoryStore

    store = DirectoryStore(tmp_path / "state")
    store.put_plan("ship_load", dumps(load_plan(str(SHIP_LOAD))))
    store.set_status("ship_load", status="running", generation=0)
    m = Migration(id="m1", query="ship_load", new_plan=str(SHIP_LOAD),
                  old_instance="ship_load", new_instance="ship_load.g1", generation=1,
                  kind="shadow", phase="cut", bootstrap=bootstrap,
                  high={"packages": {"0": 5, "1": 3}})
    m.save(store)
    return store


class RefusingProducer:
    """confluent-kafka's Producer as a broker that refuses the record of partition 1."""

    def __init__(self, conf):
        self.conf = conf
        self.queued = []

    def list_topics(self, topic, timeout=None):
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None,
                                                              partitions={0: 0, 1: 1})})

    def produce(self, topic, value=None, key=None, partition=-1, headers=None,
                on_delivery=None):
        self.queued.append((topic, partition, on_delivery))

    def flush(self, timeout=None):
        from confluent_kafka import KafkaError

        for t, p, cb in self.queued:
            err = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED) if p == 1 else None
            cb(err, SimpleNamespace(topic=lambda t=t: t, partition=lambda p=p: p,
                                    offset=lambda: 9))
        self.queued = []
        return 0

    def purge(self):
        self.queued = []

    def close(self):
        return True


def test_a_refused_control_event_ends_the_step_with_one_migration_error(tmp_path,
                                                                        monkeypatch):
    import confluent_kafka

    from migrate import migration, runner
    from migrate.context import Context
    from migrate.record import resume_hint

    monkeypatch.setattr(confluent_kafka, "Producer", RefusingProducer)
    store = cut_phase_store(tmp_path, "broker:9092")
    m = migration.current(store, "ship_load")
    with pytest.raises(MigrationError) as e:  # step 4 (a resume pauses again first)
        runner.step(m, Context(store, lambda s: None, 30, hint=resume_hint("ship_load")))
    text = e.value.render()
    assert "step 4 (cut)" in text
    assert "topic 'packages', partition 1" in text
    assert "Topic authorization failed" in text
    assert "theseus migrate resume ship_load" in text
    assert isinstance(e.value.__cause__, ControlError)
    m = migration.current(store, "ship_load")
    assert m.phase == "cut" and not m.cut  # nothing recorded: resume retries the step
    assert "partition 1" in (m.error or "")


def test_migrate_resume_with_a_broker_that_does_not_answer_is_one_line_and_exit_5(tmp_path):
    """Resumed in step 4, a migration pauses again from the new high watermarks (its queries
    may have read on since: :mod:`migrate.phases.catch_up`), and step 3 cannot reach the
    broker: the CLI says so in one line, naming the step and the topic (the migration stays
    resumable)."""
    store = cut_phase_store(tmp_path, "127.0.0.1:9")  # nothing listens on port 9
    r = subprocess.run([sys.executable, "-m", "migrate.cli", "migrate", "resume", "ship_load",
                        "--state", str(store.root), "--timeout", "2"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 5, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    errs = r.stderr.splitlines()
    assert len(errs) == 1 and errs[0].startswith("theseus: error: "), r.stderr
    assert "step 3 (pause)" in errs[0] and "topic 'packages'" in errs[0]
    assert "migrate resume ship_load" in errs[0]
