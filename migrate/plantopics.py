"""The topics a plan reads and writes, as the cluster has them, checked before anything is
written: ``theseus run`` (before Spark starts) and step 1 of a migration (before a shadow, a
gate or a control event) refuse a source topic that does not exist, warn on an empty one,
and ``theseus run`` creates a missing output topic.

**Why ``theseus run`` creates a missing output topic, and how.**  Left to the broker, the
first write would either fail (``auto.create.topics.enable=false``, the setting production
clusters use: the exactly-once sink's first transaction fails after Spark started, with a raw
``UNKNOWN_TOPIC_OR_PART``) or create the topic with the broker's defaults (``num.partitions``,
often 1, and ``cleanup.policy=delete``: a keyed table whose keys retention deletes, which the
reconciliation at a migration's cut and every reader of the table take for compacted).  A
plan says what its output is, as ksqlDB's ``CREATE TABLE AS SELECT`` does, which creates its
sink topic too: so the topic is created explicitly, before Spark starts, with

* the partitions of the plan's first source (the one reached from the sink through every
  step's first input, ksqlDB's "as its input": the plan has no partition count of its own
  for its output), and
* ``cleanup.policy=compact`` for a keyed ``update`` or ``complete`` sink (a table: the last
  value per key is the output); an ``append`` sink (a stream) keeps the broker's policy,

and waits until every partition has a leader (a transactional producer's first write to a
partition without one fails).  One line says what was created and why.  When the broker
refuses the creation (no CREATE permission, a policy), the run is refused before Spark
starts, in one line naming the topic and the command that creates it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from compat.errors import BrokerError, Refused
from compat.model import Plan
from compat.steps import Source
from gates.broker import create_topic, topics_of
from gates.kafkaconf import user


def avro_topics(*plans: Plan) -> set[str]:
    """The topics the plans read or write in the registry's wire format (format avro): a
    control event there carries its payload in its header alone (``gates.control``)."""
    out = set()
    for plan in plans:
        for n in plan.nodes.values():
            if getattr(n, "format", None) == "avro" and getattr(n, "topic", None):
                out.add(n.topic)
    return out


def avro_key_topics(*plans: Plan) -> set[str]:
    """The topics whose record keys the plans read or write in the wire format
    (``avro.key``): a control event there has a null key where it can (``gates.control``)."""
    out = set()
    for plan in plans:
        for n in plan.nodes.values():
            avro = getattr(n, "avro", None)
            if getattr(n, "format", None) == "avro" and avro is not None and avro.key \
                    and getattr(n, "topic", None):
                out.add(n.topic)
    return out


def _recorded(new_plan: str, old_plan: str) -> list[Plan]:
    import os

    from compat.check import load_plan

    return [load_plan(p) for p in (new_plan, old_plan) if p and os.path.exists(p)]


def migration_avro_topics(new_plan: str, old_plan: str = "") -> set[str]:
    """:func:`avro_topics` of a migration's recorded plans (paths; an older record may
    lack the old one)."""
    return avro_topics(*_recorded(new_plan, old_plan))


def control_layout(new_plan: str, old_plan: str = "") -> dict[str, set[str]]:
    """What ``gates.control`` writes differently on a migration's Avro topics, as its
    keyword arguments: ``bare_topics`` (null values), ``keyless_topics`` (Avro keys)."""
    plans = _recorded(new_plan, old_plan)
    return {"bare_topics": avro_topics(*plans), "keyless_topics": avro_key_topics(*plans)}


def sources(plan: Plan) -> list[Source]:
    """The plan's sources, in the plan's order."""
    return [n for n in plan.nodes.values() if isinstance(n, Source)]


def located(plan: Plan, node_id: str, file: str, field: str | None = None
            ) -> dict[str, str | None]:
    """Where a refusal points: the user's file and the node, with its JSON pointer when the
    file is the JSON plan (a SQL script or a job file has no JSON pointer of its own)."""
    pointer = plan.pointer(node_id, field) if file.endswith(".json") else None
    return {"file": file, "node": node_id, "pointer": pointer}


def missing_source(plan: Plan, have: Mapping[str, int], file: str,
                   bootstrap: str) -> Refused | None:
    """The refusal for the first source whose topic the cluster does not have (None when
    every one is there).  ``file``: the plan file the user gave."""
    # an authorizer lists only the topics the user may describe
    seen = f" that user '{user()}' may describe" if user() else ""
    for n in sources(plan):
        if n.topic not in have:
            return Refused(f"source '{n.id}' reads topic '{n.topic}', which does not exist",
                           **located(plan, n.id, file, "topic"),
                           expected="an existing topic",
                           found=f"no topic '{n.topic}' on {bootstrap}{seen}",
                           hint="create the topic, or correct its name in the plan; "
                                "nothing was written")
    return None


def empty_sources(plan: Plan, low: Mapping[str, Mapping[int, int]],
                  high: Mapping[str, Mapping[int, int]]) -> list[Source]:
    """The sources whose topic holds no record (nothing written yet, or all of it deleted
    by retention): the plan computes nothing from its history."""
    return [n for n in sources(plan)
            if sum(high.get(n.topic, {}).values()) - sum(low.get(n.topic, {}).values()) <= 0]


def empty_warning(n: Source, file: str) -> str:
    return (f"theseus: warning: {file}: source '{n.id}' reads topic '{n.topic}', which is "
            "empty: nothing of its history reaches the new plan")


def first_source(plan: Plan) -> Source:
    """The source reached from the sink through every step's first input (a join's left
    side); the plan's first source when that path ends elsewhere."""
    node = plan.sink
    seen: set[str] = set()
    while not isinstance(node, Source) and node.inputs and node.id not in seen:
        seen.add(node.id)
        node = plan.nodes[node.inputs[0]]
    return node if isinstance(node, Source) else sources(plan)[0]


def output_settings(plan: Plan) -> tuple[int, dict[str, str], str]:
    """The partitions and configuration of the output topic ``theseus run`` creates, and
    why, in words (see the module's docstring)."""
    src, sink = first_source(plan), plan.sink
    table = bool(sink.key_columns) and sink.mode in ("update", "complete")
    config = {"cleanup.policy": "compact"} if table else {}
    why = (f"{src.partitions} partition(s) as source '{src.id}' declares, " +
           (f"compacted: a keyed {sink.mode} output is a table" if table else
            "the broker's cleanup policy: an append output is a stream"))
    return src.partitions, config, why


def create_command(bootstrap: str, topic: str, partitions: int,
                   config: Mapping[str, str]) -> str:
    conf = "".join(f" --config {k}={v}" for k, v in config.items())
    return (f"kafka-topics --bootstrap-server {bootstrap} --create --topic {topic} "
            f"--partitions {partitions}{conf}")


def prepare(plan: Plan, bootstrap: str, file: str, echo: Callable[[str], None],
            deadline: float = 60.0) -> None:
    """``theseus run``, before Spark starts: refuse a missing source topic; create a
    missing output topic (see the module's docstring), or refuse when the broker will not."""
    have = topics_of(bootstrap, deadline)
    refusal = missing_source(plan, have, file, bootstrap)
    if refusal is not None:
        raise refusal
    topic = plan.sink.topic
    if topic in have:
        return
    partitions, config, why = output_settings(plan)
    try:
        create_topic(bootstrap, topic, partitions, config, deadline)
    except BrokerError as e:
        raise Refused(f"the output topic '{topic}' does not exist and cannot be created: "
                      f"{e.message}", **located(plan, plan.sink_id, file, "topic"),
                      expected="an output topic Theseus may create", found=e.found,
                      hint=f"create it ({create_command(bootstrap, topic, partitions, config)})"
                           "; nothing was started") from None
    echo(f"theseus: created the output topic '{topic}': {why}")
