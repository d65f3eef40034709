"""The benches' one way of writing to Kafka (bench/feed.py): a full client queue is waited
out, never a record lost or sent twice; the orders land round robin, acknowledged."""

from __future__ import annotations

import json
import sys
import types

from bench import feed


class Fake:
    """A producer whose queue is full ``full`` times before it takes a record."""

    def __init__(self, conf=None, full: int = 0):
        self.conf, self.full = conf, full
        self.sent: list[tuple] = []
        self.polls: list[float] = []
        self.flushed = False

    def produce(self, topic, value, **kw):
        if self.full:
            self.full -= 1
            raise BufferError("Local: Queue full")
        self.sent.append((topic, value, kw))

    def poll(self, timeout):
        self.polls.append(timeout)

    def flush(self, timeout):
        self.flushed = True
        return 0


def test_put_waits_out_a_full_queue_and_sends_the_record_once():
    p = Fake(full=3)
    feed.put(p, "t", b"v", key=b"k", partition=2)
    assert p.sent == [("t", b"v", {"key": b"k", "partition": 2})]
    assert p.polls == [0.05] * 3


def test_put_leaves_key_and_partition_to_the_client_when_not_given():
    p = Fake()
    feed.put(p, "t", None)  # a tombstone
    assert p.sent == [("t", None, {})]


def test_produce_orders_spreads_every_order_round_robin_and_flushes(monkeypatch):
    made: list[Fake] = []

    def producer(conf):
        made.append(Fake(conf, full=2))
        return made[-1]

    monkeypatch.setitem(sys.modules, "confluent_kafka",
                        types.SimpleNamespace(Producer=producer))
    feed.produce_orders("h:1", "orders", 7, 3, acks="all")
    (p,) = made
    assert p.conf["bootstrap.servers"] == "h:1" and p.conf["acks"] == "all"
    assert p.conf["linger.ms"] == feed.FAST["linger.ms"]
    assert [kw["partition"] for _, _, kw in p.sent] == [0, 1, 2, 0, 1, 2, 0]
    rows = [json.loads(v) for _, v, _ in p.sent]
    assert [r["order_id"] for r in rows] == [f"o{i}" for i in range(7)]
    assert rows[4] == {"order_id": "o4", "amount": 4 / 3.0, "qty": 4, "region": "test",
                       "ts": "2026-01-01T00:00:00Z"}
    assert p.flushed
