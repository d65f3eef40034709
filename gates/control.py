"""Control events: the records that mark a migration's cut in every source partition.

A control event is an ordinary Kafka record carrying the header ``theseus.control`` whose
value is the JSON object ``{"migration": id, "topic": t, "partition": p, "count": n}``
(``count`` = how many control records this migration wrote in total, over all topics and
partitions). The record value repeats that JSON; its key is ``theseus.control/<migration>``
so that it is accepted by compacted topics. Gated sources skip such records (they still
occupy an offset); nothing else about them is special.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

CONTROL_HEADER = "theseus.control"
_CONTROL_HEADER_BYTES = CONTROL_HEADER.encode()

Headers = Iterable[tuple[str, Any]] | Mapping[str, Any] | None


class ControlError(RuntimeError):
    """Writing control events failed (unknown topic, delivery error, timeout)."""


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


def topic_partitions(client: Any, topic: str, timeout: float = 10.0) -> list[int]:
    """Partition ids of ``topic`` (sorted), from a Producer/Consumer/AdminClient's metadata."""
    md = client.list_topics(topic, timeout=timeout)
    t = md.topics.get(topic)
    if t is None or t.error is not None or not t.partitions:
        err = t.error if t is not None else "not found"
        raise ControlError(f"topic {topic!r}: cannot read its partitions ({err})")
    return sorted(t.partitions)


def write_control_events(
    bootstrap: str,
    topics: list[str],
    migration_id: str,
    *,
    timeout: float = 30.0,
    producer_config: Mapping[str, Any] | None = None,
) -> dict[str, dict[int, int]]:
    """Write one control record into every partition of every topic; return the cut vector.

    Uses an idempotent producer (acks=all), waits for every delivery report (at most
    ``timeout`` seconds) and returns ``C = {topic: {partition: offset of its control record}}``.
    Raises :class:`ControlError` if any record was not delivered.
    """
    from confluent_kafka import Producer

    conf = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 0,
        "message.timeout.ms": int(max(timeout, 1.0) * 1000),
    }
    conf.update(producer_config or {})
    producer = Producer(conf)
    try:
        layout = {t: topic_partitions(producer, t, timeout) for t in dict.fromkeys(topics)}
        count = sum(len(ps) for ps in layout.values())
        cut: dict[str, dict[int, int]] = {t: {} for t in layout}
        errors: list[str] = []

        def on_delivery(err, msg):
            if err is not None:
                errors.append(f"{msg.topic()}[{msg.partition()}]: {err}")
            else:
                cut[msg.topic()][msg.partition()] = msg.offset()

        for t, parts in layout.items():
            for p in parts:
                doc = json.dumps(
                    {"migration": migration_id, "topic": t, "partition": p, "count": count},
                    separators=(",", ":"),
                ).encode()
                producer.produce(
                    t,
                    value=doc,
                    key=f"{CONTROL_HEADER}/{migration_id}".encode(),
                    partition=p,
                    headers=[(CONTROL_HEADER, doc)],
                    on_delivery=on_delivery,
                )
        left = producer.flush(timeout)
        if left:
            raise ControlError(f"{left} control record(s) not delivered within {timeout}s")
        if errors:
            raise ControlError("control records failed: " + "; ".join(errors))
        missing = [f"{t}[{p}]" for t, ps in layout.items() for p in ps if p not in cut[t]]
        if missing:
            raise ControlError("no delivery report for " + ", ".join(missing))
        return {t: dict(sorted(ps.items())) for t, ps in cut.items()}
    finally:
        producer.flush(0)
