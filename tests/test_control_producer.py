"""Issue 26: the producer of control events is closed where it is let go: after the cut is
written (delivered or not), and when a migration that made one ahead is aborted.  Fakes for
the producer: no services."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from compat.errors import ControlError
from gates.control import write_control_events


class FakeProducer:
    """Records the calls a closing takes; ``fail`` makes every delivery report an error."""

    def __init__(self, fail: bool = False) -> None:
        self.fail, self.log, self.pending = fail, [], []

    def list_topics(self, topic, timeout=None):
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None,
                                                              partitions={0: 0, 1: 1})})

    def produce(self, topic, value=None, key=None, partition=None, headers=None,
                on_delivery=None):
        self.pending.append((topic, partition, on_delivery))

    def flush(self, timeout=None):
        self.log.append("flush")
        for offset, (topic, partition, cb) in enumerate(self.pending):
            msg = SimpleNamespace(topic=lambda t=topic: t, partition=lambda p=partition: p,
                                  offset=lambda o=offset: 40 + o)
            cb(SimpleNamespace(str=lambda: "Broker: Not enough replicas") if self.fail
               else None, msg)
        self.pending.clear()
        return 0

    def purge(self):
        self.log.append("purge")

    def close(self):
        self.log.append("close")


def test_the_control_producer_is_closed_once_the_cut_is_written():
    p = FakeProducer()
    cut = write_control_events("h:1", ["t"], "m1", deadline=5, producer=p)
    assert cut == {"t": {0: 40, 1: 41}}
    assert p.log[-1] == "close" and p.log.count("close") == 1


def test_the_control_producer_is_closed_when_a_record_is_not_delivered():
    p = FakeProducer(fail=True)
    with pytest.raises(ControlError, match="not delivered"):
        write_control_events("h:1", ["t"], "m1", deadline=5, producer=p)
    assert p.log[-1] == "close"


def test_an_abort_closes_the_producer_made_ahead_for_the_propagated_cut(tmp_path):
    """A cascade's upstream makes its control producer at step 5 (before its old query
    reaches the cut); aborted then, the propagated cut is never written: the producer is
    closed, not left to the garbage collector."""
    from migrate.context import Context
    from migrate.phases.rollback import abort
    from migrate.record import Migration
    from migrate.store import DirectoryStore

    m = Migration(id="m1", query="q", new_plan="new.json", old_instance="q", phase="align",
                  feeds=["m2"])
    ctx = Context(DirectoryStore(tmp_path), echo=lambda s: None)
    p = FakeProducer()
    ctx.producers[m.id] = p
    assert abort(m, ctx, drop_side=False).phase == "aborted"
    assert p.log[-1] == "close" and m.id not in ctx.producers
