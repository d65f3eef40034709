"""Readiness of a broker for what Theseus needs beyond "it answers": a group coordinator
(offset commits, the sink's batch ids) and a transaction coordinator (exactly-once).

A freshly started single-node broker answers ApiVersions seconds before it has loaded
``__consumer_offsets`` and ``__transaction_state``; the first group or transactional
request then fails with NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS.
"""
from __future__ import annotations

import time
import uuid


def wait_coordinators(bootstrap: str, timeout: float = 120.0) -> float:
    """Block until a committed-offset fetch and a transactional producer init succeed.

    Returns the seconds it took; raises ``TimeoutError`` naming the last error.
    """
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

    t0 = time.monotonic()
    deadline = t0 + timeout
    last: Exception | None = None
    tag = uuid.uuid4().hex[:8]
    while time.monotonic() < deadline:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"theseus-ready-{tag}",
                      "enable.auto.commit": False})
        try:
            c.committed([TopicPartition("__theseus_ready", 0)], timeout=10)
            p = Producer({"bootstrap.servers": bootstrap,
                          "transactional.id": f"theseus-ready-{tag}"})
            p.init_transactions(30)
            return time.monotonic() - t0
        except KafkaException as e:
            last = e
            time.sleep(0.5)
        finally:
            c.close()
    raise TimeoutError(f"broker {bootstrap}: coordinators not ready within {timeout:.0f}s "
                       f"(last error: {last})")
