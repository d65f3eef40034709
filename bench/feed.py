"""What the benches write to Kafka with: a producer tuned for throughput, a produce that
waits for room while the client's queue is full (a bench produces faster than the client
sends), and the orders records the stateless benches share."""

from __future__ import annotations

import json
from typing import Any

#: batching for throughput; the queue holds a bench's burst instead of refusing it
FAST = {"linger.ms": 20, "batch.size": 1_000_000, "compression.type": "lz4",
        "queue.buffering.max.messages": 1_000_000}
REGIONS = ["eu", "us", "apac", "latam", "test"]


def producer(bs: str, **conf: Any):
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bs, **FAST, **conf})


def put(p, topic: str, value, key=None, partition: int | None = None) -> None:
    """One record, produced once there is room for it in the client's queue."""
    kw: dict[str, Any] = {}
    if key is not None:
        kw["key"] = key
    if partition is not None:
        kw["partition"] = partition
    while True:
        try:
            p.produce(topic, value, **kw)
            return
        except BufferError:
            p.poll(0.05)


def order(i: int) -> bytes:
    """The ``i``-th record of the orders topic the stateless benches read."""
    return json.dumps({"order_id": f"o{i}", "amount": (i % 1000) / 3.0, "qty": i % 7,
                       "region": REGIONS[i % 5], "ts": "2026-01-01T00:00:00Z"}).encode()


def produce_orders(bs: str, topic: str, n: int, parts: int, **conf: Any) -> None:
    """``n`` orders spread round robin over ``parts`` partitions, all acknowledged."""
    p = producer(bs, **conf)
    for i in range(n):
        put(p, topic, order(i), partition=i % parts)
        if i % 50_000 == 0:
            p.poll(0)
    p.flush(120)
