"""Control events: the records that mark a migration's cut in every source partition.

A control event is an ordinary Kafka record carrying the header ``theseus.control`` whose
value is the JSON object ``{"migration": id, "topic": t, "partition": p, "count": n}``
(``count`` = how many control records this migration wrote in total, over all topics and
partitions). The record value repeats that JSON, except on an Avro topic (``bare_topics``),
where it is null: a consumer deserializing the registry's wire format reads a null value, never
a JSON body without the magic byte, while Theseus reads the header.  Its key is
``theseus.control/<migration>`` so that it is accepted by compacted topics, except on a topic
whose keys are Avro too (``keyless_topics``) and that does not compact: there the key is null,
which a key deserializer of the wire format reads as null (plain text it cannot read), and
which nothing of Theseus reads (gated sources and the reconciliation know the record by its
header; it is written to each partition by number, not by its key). A compacted topic refuses
a null key, so there the text key stays.  Gated sources skip such records (they still occupy
an offset); nothing else about them is special.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from compat.errors import BrokerError, ControlError
from gates.broker import client_conf, compacted, partitions
from gates.deadline import Deadline

CONTROL_HEADER = "theseus.control"
_CONTROL_HEADER_BYTES = CONTROL_HEADER.encode()

Headers = Iterable[tuple[str, Any]] | Mapping[str, Any] | None


def _header_value(headers: Headers, name: str = CONTROL_HEADER) -> Any:
    """The value of header ``name`` (last one wins), ``None`` when absent.

    ``headers`` is what confluent-kafka's ``Message.headers()`` returns (a list of
    ``(str, bytes)`` tuples, or None), or a mapping.
    """
    if not headers:
        return None
    if isinstance(headers, Mapping):
        return headers.get(name)
    found = None
    for item in headers:
        k = item[0]
        if k == name or (isinstance(k, bytes) and k == name.encode()):
            found = item[1] if item[1] is not None else b""
    return found


def is_control(headers: Headers) -> bool:
    """True if the record headers mark a control event."""
    if not headers:  # fast path: the common data record has no headers
        return False
    return _header_value(headers) is not None


def parse_control(headers: Headers) -> dict | None:
    """The control event's JSON value as a dict, or None when the record is not one.

    A control header whose value is not a JSON object yields ``{}`` (it is still a control
    record and must be skipped).
    """
    raw = _header_value(headers)
    if raw is None:
        return None
    try:
        doc = json.loads(raw.decode() if isinstance(raw, (bytes, bytearray)) else raw)
    except (ValueError, UnicodeDecodeError, AttributeError):
        return {}
    return doc if isinstance(doc, dict) else {}


def topic_partitions(client: Any, topic: str, timeout: Deadline | float = 10.0) -> list[int]:
    """Partition ids of ``topic`` (sorted), from a Producer/Consumer/AdminClient's metadata."""
    try:
        return partitions(client, topic, timeout)
    except BrokerError as e:
        raise ControlError(f"cannot write control events: {e.message}", topic=e.topic,
                           partition=e.partition, expected=e.expected, found=e.found) from e


WHAT = "the control records' delivery reports"


def control_producer(bootstrap: str, *, deadline: Deadline | float = 30.0,
                     producer_config: Mapping[str, Any] | None = None) -> Any:
    """The idempotent producer (acks=all) :func:`write_control_events` writes with.

    Created ahead of the moment its records are due, it is ready then: an idempotent
    producer asks for its producer id as it is created, finds no broker connection up yet,
    and asks again only 500 ms later (librdkafka's PID timer), and nothing it produces is
    sent before. In a cascade that half second lay between the old upstream query's
    last batch and the cap on the downstream's old query."""
    # librdkafka loads with the first call that reaches a broker (start-up time)
    from confluent_kafka import Producer

    deadline = Deadline.of(deadline)
    conf = client_conf(bootstrap, **{
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 0,
        "message.timeout.ms": max(1000, int(deadline.timeout(WHAT) * 1000)),
    })
    conf.update(producer_config or {})
    return Producer(conf)


def write_control_events(
    bootstrap: str,
    topics: list[str],
    migration_id: str,
    *,
    deadline: Deadline | float = 30.0,
    producer_config: Mapping[str, Any] | None = None,
    producer: Any = None,
    bare_topics: Iterable[str] = (),
    keyless_topics: Iterable[str] = (),
) -> dict[str, dict[int, int]]:
    """Write one control record into every partition of every topic; return the cut vector.
    On ``bare_topics`` (Avro topics) its value is null: the header alone carries it; on
    ``keyless_topics`` (Avro keys) that do not compact, its key is null too.

    Uses an idempotent producer (acks=all; ``producer``: one of :func:`control_producer`,
    created ahead, which this call then owns), waits for every delivery report (within
    ``deadline``: a :class:`~gates.deadline.Deadline` or seconds) and returns
    ``C = {topic: {partition: offset of its control record}}``.  Raises
    :class:`~compat.errors.ControlError` naming the topic and partition of any record that
    was not delivered, :class:`~compat.errors.DeadlineExceeded` when the deadline ran out.
    """
    # librdkafka loads with the first call that reaches a broker (start-up time)
    from confluent_kafka import KafkaException

    deadline = Deadline.of(deadline)
    what = WHAT
    if producer is None:
        producer = control_producer(bootstrap, deadline=deadline,
                                    producer_config=producer_config)
    try:
        layout = {t: topic_partitions(producer, t, deadline) for t in dict.fromkeys(topics)}
        count = sum(len(ps) for ps in layout.values())
        cut: dict[str, dict[int, int]] = {t: {} for t in layout}
        errors: list[tuple[str, int, str]] = []

        def on_delivery(err, msg):
            if err is not None:
                errors.append((msg.topic(), msg.partition(), err.str()))
            else:
                cut[msg.topic()][msg.partition()] = msg.offset()

        bare = set(bare_topics)
        keyless = _null_key_topics(bootstrap, [t for t in layout if t in set(keyless_topics)],
                                   deadline)
        for t, parts in layout.items():
            for p in parts:
                doc = json.dumps(
                    {"migration": migration_id, "topic": t, "partition": p, "count": count},
                    separators=(",", ":"),
                ).encode()
                try:
                    producer.produce(
                        t,
                        value=None if t in bare else doc,
                        key=None if t in keyless else control_key(migration_id),
                        partition=p,
                        headers=[(CONTROL_HEADER, doc)],
                        on_delivery=on_delivery,
                    )
                except (KafkaException, BufferError) as e:
                    raise ControlError(f"cannot write the control record: {e}", topic=t,
                                       partition=p) from e
        left = producer.flush(deadline.timeout(what))
        if errors:
            t, p, err = errors[0]
            more = f" (and {len(errors) - 1} other partition(s))" if len(errors) > 1 else ""
            raise ControlError(f"control record not delivered{more}", topic=t, partition=p,
                               expected="a delivery report with an offset", found=err)
        missing = [(t, p) for t, ps in layout.items() for p in ps if p not in cut[t]]
        if left or missing:
            deadline.check(what)
            t, p = missing[0] if missing else (None, None)
            raise ControlError(f"{len(missing) or left} control record(s) not delivered",
                               topic=t, partition=p, expected="a delivery report",
                               found="none before the delivery timeout")
        return {t: dict(sorted(ps.items())) for t, ps in cut.items()}
    finally:
        close_producer(producer)


def close_producer(producer: Any) -> None:
    """Close a producer now, dropping what it has not delivered (``None``: nothing to do).

    Every caller has awaited its delivery reports (or given up on them) before this, so
    nothing is lost that was not lost already, and the close does not wait for records
    that will never be delivered.  Closing takes about a millisecond on a local broker:
    measured with ``make bench-migrate``'s cascade part, letting the producer go on a
    thread instead did not shorten the stall (bench/results/dispose.md)."""
    if producer is None:
        return
    producer.purge()
    producer.flush(0)  # serves the purged records' delivery reports
    producer.close()


def _null_key_topics(bootstrap: str, topics: list[str], deadline: Deadline) -> set[str]:
    """Those of ``topics`` (Avro keys) whose control records get a null key: the ones that
    do not compact (module doc)."""
    try:
        return set(topics) - compacted(bootstrap, topics, deadline)
    except BrokerError as e:
        raise ControlError(f"cannot write control events: {e.message}", topic=e.topic,
                           partition=e.partition, expected=e.expected, found=e.found) from e


def control_key(migration_id: str) -> bytes:
    """The key of a migration's control records (and of their tombstones)."""
    return f"{CONTROL_HEADER}/{migration_id}".encode()


def tombstone_control_events(
    bootstrap: str,
    migration_id: str,
    written: Mapping[str, Mapping[int, int]],
    *,
    deadline: Deadline | float = 30.0,
    keyless_topics: Iterable[str] = (),
) -> int:
    """Once a migration is over, write a tombstone for its control records' key into every
    partition that got one (``written``: the cut C), so a compacted topic drops them (after
    its ``delete.retention.ms``) instead of keeping them forever.  Not where the control
    records had a null key (``keyless_topics`` that do not compact): a null key is never
    compacted, and a tombstone has no key to name there.  The tombstone carries the
    ``theseus.control`` header too (value ``{"migration", "topic", "partition",
    "tombstone": true}``): gated sources skip it, and any reader that skips control records
    by their header skips it the same way.  Writing it twice is harmless (a resumed
    migration may).  Returns how many were written."""
    # librdkafka loads with the first call that reaches a broker (start-up time)
    from confluent_kafka import KafkaException, Producer

    deadline = Deadline.of(deadline)
    what = "the control records' tombstones to be delivered"
    producer = Producer(client_conf(bootstrap, **{
        "enable.idempotence": True, "acks": "all", "linger.ms": 5,
        "message.timeout.ms": max(1000, int(deadline.timeout(what) * 1000))}))
    errors: list[tuple[str, int, str]] = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append((msg.topic(), msg.partition(), err.str()))

    n = 0
    try:
        keyless = _null_key_topics(bootstrap, [t for t in written if t in set(keyless_topics)],
                                   deadline)
        for t, parts in written.items():
            if t in keyless:
                continue
            for p in parts:
                doc = json.dumps({"migration": migration_id, "topic": t, "partition": int(p),
                                  "tombstone": True}, separators=(",", ":")).encode()
                try:
                    producer.produce(t, value=None, key=control_key(migration_id),
                                     partition=int(p), headers=[(CONTROL_HEADER, doc)],
                                     on_delivery=on_delivery)
                except (KafkaException, BufferError) as e:
                    raise ControlError(f"cannot write the control records' tombstone: {e}",
                                       topic=t, partition=int(p)) from e
                n += 1
        left = producer.flush(deadline.timeout(what))
        if errors or left:
            deadline.check(what)
            t, p, err = errors[0] if errors else (None, None, "no delivery report")
            raise ControlError("control record tombstone not delivered", topic=t,
                               partition=p, expected="a delivery report", found=err)
        return n
    finally:
        close_producer(producer)
