"""Kafka calls shared by the gates and the migrator, each bounded by a :class:`Deadline`.

* :func:`partitions` and :func:`watermarks`: a topic's partitions and its low or high
  watermarks, failing with one :class:`~compat.errors.BrokerError` that names the broker or
  the topic and partition (never a bare ``KafkaException`` or ``KeyError``).
* :func:`wait_coordinators`: readiness of a broker for what Theseus needs beyond "it
  answers": a group coordinator (offset commits, the sink's batch ids) and a transaction
  coordinator (exactly-once).  A freshly started single-node broker answers ApiVersions
  seconds before it has loaded ``__consumer_offsets`` and ``__transaction_state``; the first
  group or transactional request then fails with NOT_COORDINATOR or
  COORDINATOR_LOAD_IN_PROGRESS.
"""
from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from compat.errors import BrokerError
from gates.deadline import Deadline

Offsets = dict[str, dict[int, int]]

# librdkafka logs every failed connection attempt (every 50 ms for a broker that is down):
# the clients of a migration report a failure once, as an error naming what failed.
QUIET = logging.getLogger("theseus.kafka")
QUIET.addHandler(logging.NullHandler())
QUIET.propagate = False


def client_conf(bootstrap: str, **conf: Any) -> dict[str, Any]:
    """The configuration of a short-lived client of the migrator: quiet, errors raised."""
    return {"bootstrap.servers": bootstrap, "logger": QUIET, **conf}


def _kafka_error(e: BaseException) -> str:
    err = e.args[0] if e.args else e
    return str(err.str() if hasattr(err, "str") else err)


def partitions(client: Any, topic: str, deadline: Deadline | float = 10.0) -> list[int]:
    """Partition ids of ``topic`` (sorted), from a Producer/Consumer/AdminClient's metadata."""
    from confluent_kafka import KafkaException

    deadline = Deadline.of(deadline)
    what = f"the metadata of topic '{topic}'"
    try:
        md = client.list_topics(topic, timeout=deadline.timeout(what))
    except KafkaException as e:
        deadline.check(what)
        raise BrokerError(f"cannot read the topic's metadata: {_kafka_error(e)}",
                          topic=topic) from e
    t = md.topics.get(topic)
    if t is None or t.error is not None or not t.partitions:
        found = "no such topic" if t is None or t.error is None else str(t.error.str())
        raise BrokerError("cannot read the topic's partitions", topic=topic,
                          expected="an existing topic with partitions", found=found)
    return sorted(t.partitions)


def watermarks(bootstrap: str, topics: list[str], deadline: Deadline | float = 30.0, *,
               low: bool = False) -> Offsets:
    """``{topic: {partition: offset}}``: the high watermarks (the next offset to be written)
    of every partition of ``topics``, or with ``low`` the earliest offsets still retained."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    deadline = Deadline.of(deadline)
    c = Consumer(client_conf(bootstrap, **{"group.id": "theseus-migrator",
                                           "enable.auto.commit": False}))
    try:
        out: Offsets = {}
        for t in topics:
            out[t] = {}
            for p in partitions(c, t, deadline):
                what = f"the watermarks of topic '{t}' partition {p}"
                try:
                    lo, hi = c.get_watermark_offsets(TopicPartition(t, p),
                                                     timeout=deadline.timeout(what))
                except KafkaException as e:
                    deadline.check(what)
                    raise BrokerError(f"cannot read the watermarks: {_kafka_error(e)}",
                                      topic=t, partition=p) from e
                out[t][p] = int(lo if low else hi)
        return out
    finally:
        c.close()


def wait_coordinators(bootstrap: str, deadline: Deadline | float = 120.0) -> float:
    """Block until a committed-offset fetch and a transactional producer init succeed.

    Returns the seconds it took; raises :class:`BrokerError` naming the last error when the
    deadline passes first.
    """
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

    deadline = Deadline.of(deadline)
    t0 = time.monotonic()
    last: Exception | None = None
    tag = uuid.uuid4().hex[:8]
    while not deadline.expired():
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"theseus-ready-{tag}",
                      "enable.auto.commit": False})
        try:
            c.committed([TopicPartition("__theseus_ready", 0)],
                        timeout=deadline.remaining() or 0.1)
            p = Producer({"bootstrap.servers": bootstrap,
                          "transactional.id": f"theseus-ready-{tag}"})
            p.init_transactions(deadline.remaining() or 0.1)
            return time.monotonic() - t0
        except KafkaException as e:
            last = e
            time.sleep(min(0.5, deadline.remaining()))
        finally:
            c.close()
    raise BrokerError(f"broker {bootstrap}: group and transaction coordinators not ready "
                      f"within {deadline.seconds:.0f} s",
                      expected="a committed-offset fetch and a transactional init to succeed",
                      found=f"last error: {_kafka_error(last) if last else 'none'}")
