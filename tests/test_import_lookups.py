"""How many partitions a job's source topic has is asked of the broker the job names, on
every import and every cache hit: one admin client per broker for the whole process, and a
broker that did not answer is not waited for again."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from migrate import adopt


class FakeAdmin:
    made: list[dict] = []
    asked: list[str] = []
    down: set[str] = set()

    def __init__(self, conf: dict) -> None:
        FakeAdmin.made.append(conf)
        self.bootstrap = conf["bootstrap.servers"]

    def list_topics(self, topic: str, timeout: float) -> SimpleNamespace:
        FakeAdmin.asked.append(f"{self.bootstrap}/{topic}")
        if self.bootstrap in FakeAdmin.down:
            raise RuntimeError("KafkaError{code=_TRANSPORT}: timed out")
        parts = {0: None, 1: None} if topic.startswith("t") else {}
        error = None if parts else "UNKNOWN_TOPIC_OR_PART"
        return SimpleNamespace(topics={topic: SimpleNamespace(partitions=parts, error=error)})


@pytest.fixture
def admin(monkeypatch):
    import confluent_kafka.admin as admin_mod

    monkeypatch.setattr(admin_mod, "AdminClient", FakeAdmin)
    monkeypatch.setattr(adopt, "_ADMINS", {})
    FakeAdmin.made, FakeAdmin.asked, FakeAdmin.down = [], [], set()
    return FakeAdmin


def test_one_client_per_broker_answers_every_topic(admin):
    got = [adopt.topic_partitions("b:1", t) for t in ("t1", "t2", "missing", "t1")]
    assert got == [2, 2, None, 2]
    assert len(admin.made) == 1  # each question is asked, of one client
    assert admin.asked == ["b:1/t1", "b:1/t2", "b:1/missing", "b:1/t1"]
    assert adopt.topic_partitions("c:1", "t3") == 2
    assert [c["bootstrap.servers"] for c in admin.made] == ["b:1", "c:1"]


def test_a_broker_that_did_not_answer_is_not_asked_again(admin):
    admin.down.add("gone:1")
    assert adopt.topic_partitions("gone:1", "t1") is None
    assert adopt.topic_partitions("gone:1", "t2") is None
    assert admin.asked == ["gone:1/t1"]
    assert adopt.topic_partitions("b:1", "t1") == 2  # other brokers still are
