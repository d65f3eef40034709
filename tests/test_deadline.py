"""Issue 11: one Deadline is passed to every wait and every Kafka call of a migration; each
call gets what is left (capped), and running out raises one DeadlineExceeded naming what was
awaited.  Clocks are fakes: nothing here is timed."""

from __future__ import annotations

import ast
from types import SimpleNamespace

import pytest

from compat.errors import DeadlineExceeded, MigrationError
from gates.deadline import CALL_CAP, Deadline
from tests.conftest import ROOT


class Clock:
    def __init__(self, now: float = 1000.0, step: float = 0.0) -> None:
        self.now = now
        self.step = step  # seconds that pass on every reading

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_remaining_never_negative_and_calls_are_capped():
    clock = Clock()
    d = Deadline(100, clock=clock)
    assert d.remaining() == 100 and not d.expired()
    assert d.timeout("x") == CALL_CAP  # plenty left: one call gets at most the cap
    clock.now += 95
    assert d.timeout("x") == pytest.approx(5)  # near the end: what is left
    assert d.timeout("x", cap=2) == 2
    clock.now += 10
    assert d.remaining() == 0 and d.expired()


def test_running_out_names_what_was_awaited_and_says_what_to_do():
    clock = Clock()
    d = Deadline(60, hint="theseus migrate resume q continues", clock=clock)
    d.check("anything")  # not yet
    clock.now += 61
    with pytest.raises(DeadlineExceeded) as e:
        d.timeout("'q' to reach the cut")
    assert isinstance(e.value, MigrationError) and e.value.exit_code == 5
    assert "'q' to reach the cut" in str(e.value) and "60 s" in str(e.value)
    assert "theseus migrate resume q" in str(e.value)


def test_a_budget_within_a_budget_never_outlives_it():
    clock = Clock()
    d = Deadline(10, clock=clock)
    assert d.within(30).remaining() == 10  # capped by the outer budget
    assert d.within(3).remaining() == 3
    short = d.within(3)
    clock.now += 4
    assert short.expired() and not d.expired()


def test_of_takes_a_deadline_or_seconds():
    d = Deadline(5)
    assert Deadline.of(d) is d
    assert Deadline.of(7).seconds == 7


def test_the_migrators_waits_share_its_deadline(tmp_path):
    """Context.wait polls until the one deadline of the run is spent, then raises."""
    from migrate.context import Context
    from migrate.record import Migration
    from migrate.store import DirectoryStore

    clock = Clock(step=1.0)  # every reading of the clock: a second later
    deadline = Deadline(5, clock=clock)
    m = Migration(id="m1", query="q", new_plan="new.json", old_instance="q")
    ctx = Context(DirectoryStore(tmp_path), lambda s: None, deadline=deadline)
    polls = []
    with pytest.raises(DeadlineExceeded) as e:
        ctx.wait(m, "'q' to reach H", lambda: polls.append(1) and False, interval=0.0)
    assert "'q' to reach H" in str(e.value)
    assert 1 <= len(polls) <= 5
    # every service of the run takes the same one
    assert ctx.deadline is ctx.topics.deadline is ctx.processes.deadline is \
        ctx.gates.deadline is deadline


class RecordingConsumer:
    """confluent-kafka's Consumer, recording the timeout of every call."""

    calls: list[tuple[str, float]] = []

    def __init__(self, conf):
        self.conf = conf

    def list_topics(self, topic, timeout=None):
        self.calls.append(("list_topics", timeout))
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None,
                                                              partitions={0: 0, 1: 1})})

    def get_watermark_offsets(self, tp, timeout=None):
        self.calls.append(("get_watermark_offsets", timeout))
        return 3, 40 + tp.partition

    def close(self):
        pass


def test_watermarks_give_every_kafka_call_what_is_left(monkeypatch):
    import confluent_kafka

    from gates.broker import watermarks

    monkeypatch.setattr(confluent_kafka, "Consumer", RecordingConsumer)
    RecordingConsumer.calls = []
    clock = Clock(step=2.0)
    d = Deadline(20, clock=clock)
    assert watermarks("b:9092", ["t"], d) == {"t": {0: 40, 1: 41}}
    assert watermarks("b:9092", ["t"], Deadline(100), low=True) == {"t": {0: 3, 1: 3}}
    first = RecordingConsumer.calls[:3]
    assert [c[0] for c in first] == ["list_topics", "get_watermark_offsets",
                                     "get_watermark_offsets"]
    timeouts = [t for _, t in first]
    assert timeouts == sorted(timeouts, reverse=True)  # each gets less: one budget
    assert all(0 < t < 20 for t in timeouts)
    assert all(t <= CALL_CAP for _, t in RecordingConsumer.calls)


def test_watermarks_out_of_budget_raise_naming_the_partition(monkeypatch):
    import confluent_kafka

    from gates.broker import watermarks

    monkeypatch.setattr(confluent_kafka, "Consumer", RecordingConsumer)
    clock = Clock(step=3.0)
    with pytest.raises(DeadlineExceeded) as e:
        watermarks("b:9092", ["t"], Deadline(5, clock=clock))
    assert "topic 't' partition" in str(e.value)


#: the migrator (its entry points, runner, context, phase handlers and services) and the
#: Kafka calls it makes
MIGRATION_CODE = ["migrate/migration.py", "migrate/cascade.py", "migrate/context.py",
                  "migrate/runner.py", "gates/control.py", "gates/broker.py"] + sorted(
    str(p.relative_to(ROOT)) for d in ("phases", "services")
    for p in (ROOT / "migrate" / d).glob("*.py"))


@pytest.mark.parametrize("path", MIGRATION_CODE)
def test_no_fixed_timeouts_of_their_own_in_the_migrations_code(path):
    """No call of a migration takes a literal timeout, and no wait makes a clock of its own
    (``time.monotonic() + 30``): every one takes the migration's Deadline."""
    tree = ast.parse((ROOT / path).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg in ("timeout", "request_timeout"):
                    assert not isinstance(kw.value, ast.Constant), \
                        f"{path}:{node.lineno}: a fixed {kw.arg}={kw.value.value}"
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr == "monotonic" and path != \
                    "gates/broker.py":
                pytest.fail(f"{path}:{node.lineno}: a clock of its own")
