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

import time
import uuid
from typing import Any

from compat.errors import BrokerError, DeadlineExceeded
from gates.deadline import Deadline
from gates.kafkaconf import QUIET, active, user
from gates.retry import Unanswered, retry, retry_each, retryable

Offsets = dict[str, dict[int, int]]


def client_conf(bootstrap: str, **conf: Any) -> dict[str, Any]:
    """The configuration of a client Theseus creates: quiet (errors are raised, not
    logged), with the process's Kafka settings (``--kafka-config``, :mod:`gates.kafkaconf`)
    under the settings of this client's role."""
    return {"bootstrap.servers": bootstrap, "logger": QUIET, **active(), **conf}


def _kafka_error(e: BaseException) -> str:
    err = e.args[0] if e.args else e
    return str(err.str() if hasattr(err, "str") else err)


def partitions(client: Any, topic: str, deadline: Deadline | float = 10.0) -> list[int]:
    """Partition ids of ``topic`` (sorted), from a Producer/Consumer/AdminClient's metadata."""
    # librdkafka loads with the first call that reaches a broker (start-up time)
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
    # librdkafka loads with the first call that reaches a broker (start-up time)
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
                tp = TopicPartition(t, p)
                try:
                    # a partition whose leader died answers again once another is elected
                    # (broker.session.timeout.ms): asked again within LEADER_WAIT
                    lo, hi = retry(lambda timeout, tp=tp: c.get_watermark_offsets(
                        tp, timeout=timeout), deadline.within(LEADER_WAIT), what)
                except KafkaException as e:
                    deadline.check(what)
                    raise BrokerError(f"cannot read the watermarks: {_kafka_error(e)}",
                                      topic=t, partition=p) from e
                out[t][p] = int(lo if low else hi)
        return out
    finally:
        c.close()


#: seconds to wait for a partition to get a leader again (a broker died)
LEADER_WAIT = 60.0


def topics_of(bootstrap: str, deadline: Deadline | float = 30.0) -> dict[str, int]:
    """Every topic of the cluster with its partition count, from one metadata request
    (which, unlike a producer's or a consumer's, never auto-creates a topic)."""
    # librdkafka loads with the first call that reaches a broker (start-up time)
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    deadline = Deadline.of(deadline)
    admin = AdminClient(client_conf(bootstrap))
    what = f"the broker {bootstrap} to list its topics"
    try:
        listed = retry(lambda t: admin.list_topics(timeout=t).topics, deadline, what)
    except KafkaException as e:
        deadline.check(what)
        raise BrokerError(f"cannot list the topics of broker {bootstrap}: "
                          f"{_kafka_error(e)}") from e
    return {t: len(md.partitions) for t, md in listed.items() if md.error is None}


def compacted(bootstrap: str, topics: list[str], deadline: Deadline | float = 30.0
              ) -> set[str]:
    """Those of ``topics`` whose ``cleanup.policy`` compacts (``compact`` or
    ``compact,delete``): a broker refuses a record without a key there."""
    if not topics:
        return set()
    # librdkafka loads with the first call that reaches a broker (start-up time)
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, ConfigResource

    deadline = Deadline.of(deadline)
    admin = AdminClient(client_conf(bootstrap))
    out = set()
    for topic in topics:
        what = f"the cleanup policy of topic '{topic}'"

        def policy(timeout: float, topic: str = topic) -> str:
            res = ConfigResource(ConfigResource.Type.TOPIC, topic)
            fut = admin.describe_configs([res], request_timeout=timeout)[res]
            entry = fut.result(timeout).get("cleanup.policy")
            return entry.value if entry is not None and entry.value else "delete"

        try:
            if "compact" in retry(policy, deadline, what):
                out.add(topic)
        except KafkaException as e:
            deadline.check(what)
            raise BrokerError(f"cannot read the topic's configuration: {_kafka_error(e)}",
                              topic=topic) from e
    return out


def create_topic(bootstrap: str, topic: str, partitions: int,
                 config: dict[str, str] | None = None,
                 deadline: Deadline | float = 60.0) -> bool:
    """Create ``topic`` (the cluster's default replication factor) and wait until every
    partition has a leader: a transactional producer's first write to a partition without
    one fails.  False when it existed already (created meanwhile by another process)."""
    # librdkafka loads with the first call that reaches a broker (start-up time)
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    deadline = Deadline.of(deadline)
    admin = AdminClient(client_conf(bootstrap))
    created = {"now": True}

    def create(timeout: float) -> None:
        fut = admin.create_topics([NewTopic(topic, partitions, -1, config=config or {})],
                                  request_timeout=timeout)[topic]
        try:
            fut.result(timeout)
        except KafkaException as e:
            if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
            created["now"] = False

    what = f"topic '{topic}' to be created"
    try:
        retry(create, deadline, what)
        what = f"the partitions of topic '{topic}' to have leaders"
        while True:
            md = admin.list_topics(topic, timeout=deadline.timeout(what)).topics.get(topic)
            if md is not None and md.error is None and len(md.partitions) >= partitions and \
                    all(p.leader >= 0 for p in md.partitions.values()):
                return created["now"]
            deadline.sleep(0.1, what)
    except KafkaException as e:
        deadline.check(what)
        raise BrokerError(f"cannot create the topic: {_kafka_error(e)}", topic=topic,
                          expected=f"a topic of {partitions} partition(s)",
                          found=_kafka_error(e)) from e


def wait_coordinators(bootstrap: str, deadline: Deadline | float = 120.0) -> float:
    """Block until a committed-offset fetch and a transactional producer init succeed.

    Returns the seconds it took; raises :class:`BrokerError` naming the last error when the
    deadline passes first.
    """
    # librdkafka loads with the first call that reaches a broker (start-up time)
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

    deadline = Deadline.of(deadline)
    t0 = time.monotonic()
    tag = uuid.uuid4().hex[:8]

    def ready(timeout: float) -> None:
        c = Consumer(client_conf(bootstrap, **{"group.id": f"theseus-ready-{tag}",
                                               "enable.auto.commit": False}))
        try:
            c.committed([TopicPartition("__theseus_ready", 0)], timeout=timeout)
            p = Producer(client_conf(bootstrap, **{"transactional.id": f"theseus-ready-{tag}"}))
            p.init_transactions(timeout)
        finally:
            c.close()

    try:
        retry(ready, deadline, "the group and transaction coordinators")
    except (KafkaException, DeadlineExceeded) as e:
        waited = f" within {deadline.seconds:.0f} s" if retryable(e) or deadline.expired() \
            else ""
        raise BrokerError(f"broker {bootstrap}: group and transaction coordinators not "
                          f"ready{waited}",
                          expected="a committed-offset fetch and a transactional init to "
                                   "succeed",
                          found=f"last error: {_kafka_error(e)}") from e
    return time.monotonic() - t0


#: seconds one DescribeTopics request of :func:`check_access` may take before it is asked again
ACCESS_CALL_CAP = 10.0

#: why a Theseus client needs an operation on a topic, as ``check_access`` says it
Need = tuple[str, str, str]  # (topic, "READ" | "WRITE" | "DESCRIBE", why)


def check_access(bootstrap: str, needs: list[Need],
                 deadline: Deadline | float = LEADER_WAIT, *, client: Any = None) -> None:
    """Refuse, before anything is written, when the authenticated user lacks an operation a
    query or a migration needs on a topic (Kafka's authorizer would refuse it later, after
    other writes: a transaction half-way, control events in some partitions only).

    ``needs`` lists ``(topic, operation, why)``; the topics' authorized operations come from
    one DescribeTopics request (KIP-430).  A broker without an authorizer allows everything.
    Raises :class:`BrokerError` naming the topic, the missing operation, the user and why it
    is needed, with the ``kafka-acls`` command that grants it.
    """
    if not needs:
        return
    # librdkafka loads with the first call that reaches a broker (start-up time)
    from confluent_kafka import KafkaException, TopicCollection
    from confluent_kafka.admin import AdminClient

    deadline = Deadline.of(deadline)
    admin = client or AdminClient(client_conf(bootstrap))
    who = user() or "this client"
    topics = list(dict.fromkeys(t for t, _, _ in needs))
    what = "the topics' authorized operations"

    def describe(todo: list[str], cap: float) -> dict[str, Any]:
        futs = admin.describe_topics(TopicCollection(todo), include_authorized_operations=True,
                                     request_timeout=cap)
        out: dict[str, Any] = {}
        for t in todo:
            try:
                ops = futs[t].result(timeout=cap + 2).authorized_operations
                out[t] = None if ops is None else {o.name for o in ops}
            except (KafkaException, TimeoutError) as e:
                err = e.args[0] if e.args else None
                name = err.name() if err is not None and hasattr(err, "name") else ""
                if name == "TOPIC_AUTHORIZATION_FAILED":
                    out[t] = set()  # not even DESCRIBE
                elif name == "UNKNOWN_TOPIC_OR_PART":
                    # not there yet: the broker creates it on the first write when it may
                    # (auto.create.topics.enable), and the authorizer then judges the creation
                    out[t] = None
                else:
                    out[t] = e
        return out

    # One request may go to a broker that has just died and wait for it in vain: each is
    # capped at ACCESS_CALL_CAP and asked again (of another broker) while the deadline
    # lasts, so that one broker of three may die while a query starts.
    try:
        allowed: dict[str, set[str] | None] = retry_each(describe, topics, deadline, what,
                                                         cap=ACCESS_CALL_CAP)
    except Unanswered as e:
        deadline.check(what)
        raise BrokerError(f"cannot describe the topic: {_kafka_error(e.error)}",
                          topic=e.key) from e.error
    implied = {"READ": {"READ", "ALL"}, "WRITE": {"WRITE", "ALL"},
               "DESCRIBE": {"DESCRIBE", "READ", "WRITE", "DELETE", "ALTER", "ALL"}}
    for t, op, why in needs:
        ops = allowed[t]
        if ops is None or ops & implied.get(op, {op}):
            continue
        principal = f"User:{user()}" if user() else "User:<name>"
        raise BrokerError(
            f"user '{who}' has no {op} permission on the topic, which {why}",
            topic=t, expected=f"{op} allowed", found=", ".join(sorted(ops)) or "no access",
            hint=f"grant it, e.g. kafka-acls --bootstrap-server {bootstrap} --add "
                 f"--allow-principal {principal} --operation {op.capitalize()} --topic {t}; "
                 "nothing was written")
