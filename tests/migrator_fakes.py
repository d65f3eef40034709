"""A migrator without services, for unit tests of its guards and exit codes: the cluster's
topics and watermarks answered from memory, query hosts that obey at once, and a spy on
every control event the migrator would write.  Everything else (the store, the records,
the gates, the runner, the CLI) is the real thing."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import gates.control
from compat.check import load_plan
from compat.serde import dumps
from gates.state import GateState, write_ack
from migrate.phases import check as check_phase
from migrate.services.processes import Processes
from migrate.services.topics import TopicAdmin
from migrate.store import DirectoryStore


def agg_doc(query: str, src: str, out: str, filt: str | None = None,
            arg: str = "x") -> dict:
    """A keyed sum per ``k`` of ``src`` into ``out`` (an ``update`` sink: reconciled)."""
    nodes: list[dict[str, Any]] = [
        {"id": "orders", "step": "source", "version": 1, "topic": src, "partitions": 3,
         "format": "json", "role": "stream",
         "schema": [{"name": "k", "type": "string"}, {"name": "x", "type": "bigint"}]}]
    feed = "orders"
    if filt:
        nodes.append({"id": "keep", "step": "filter", "version": 1, "inputs": ["orders"],
                      "predicate": filt})
        feed = "keep"
    nodes += [
        {"id": "per_key", "step": "aggregate", "version": 1, "inputs": [feed],
         "group_by": [{"name": "k", "expr": "k"}],
         "aggregates": [{"name": "s", "function": "sum", "args": [arg]}]},
        {"id": "out", "step": "sink", "version": 1, "inputs": ["per_key"], "topic": out,
         "format": "json", "key_columns": ["k"], "mode": "update",
         "delivery": "exactly_once"}]
    return {"format": "theseus.plan/1", "query": query, "config": {"state_partitions": 2},
            "nodes": nodes}


class Fakes:
    """Install with :meth:`install`; ``topics``: name -> partitions; ``high`` (``low``):
    name -> the high (low) watermark of each of its partitions (0 when not given)."""

    def __init__(self, topics: dict[str, int], high: dict[str, int] | None = None,
                 low: dict[str, int] | None = None) -> None:
        self.topics = dict(topics)
        self.high = dict(high or {})
        self.low = dict(low or {})
        self.control_events: list[tuple] = []
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.spawned: list[str] = []

    def offsets(self, topics: list[str], low: bool = False) -> dict[str, dict[int, int]]:
        at = self.low if low else self.high
        return {t: {p: at.get(t, 0) for p in range(self.topics[t])} for t in topics}

    def install(self, monkeypatch) -> Fakes:
        fk = self
        monkeypatch.setattr(TopicAdmin, "present", lambda self, b: dict(fk.topics))
        monkeypatch.setattr(TopicAdmin, "high_watermarks", lambda self, b, ts: fk.offsets(ts))
        monkeypatch.setattr(TopicAdmin, "low_watermarks",
                            lambda self, b, ts: fk.offsets(ts, low=True))

        def ensure(self, m, topic, partitions, config=None):
            if topic not in fk.topics:
                fk.topics[topic] = partitions
                fk.created.append(topic)

        def delete_topic(self, bootstrap, topic):
            fk.topics.pop(topic, None)
            fk.deleted.append(topic)

        monkeypatch.setattr(TopicAdmin, "ensure", ensure)
        monkeypatch.setattr(TopicAdmin, "delete_topic", delete_topic)
        monkeypatch.setattr(TopicAdmin, "tombstone_controls", lambda self, m: None)
        monkeypatch.setattr(check_phase, "require_access", lambda *a: None)
        monkeypatch.setattr(check_phase, "checkpoint_agrees", lambda *a: True)

        def control_events(*a, **kw):  # a migrator that gets here has cut
            fk.control_events.append((a, kw))
            raise AssertionError("a control event was written")

        monkeypatch.setattr(gates.control, "write_control_events", control_events)
        FakeHosts(fk).install(monkeypatch)
        return self


class FakeHosts:
    """``theseus run`` as the store sees it: a spawned instance runs at once, has read its
    source topics to their high watermarks (its acknowledgements), and stops when asked."""

    def __init__(self, fakes: Fakes) -> None:
        self.fakes = fakes

    def install(self, monkeypatch) -> None:
        fk = self.fakes

        def spawn(hosts, m, plan_path, instance, generation, gated):
            fk.spawned.append(instance)
            hosts.store.put_plan(instance, dumps(load_plan(plan_path)))
            hosts.store.set_status(instance, status="running", pid=os.getpid(),
                                   generation=generation)
            for t, parts in fk.offsets(sorted({n.topic for n in load_plan(plan_path)
                                               .nodes.values() if n.step == "source"})
                                       ).items():
                write_ack(hosts.store.root, instance, t, parts, GateState("open", {}, 0))
            return os.getpid()

        monkeypatch.setattr(Processes, "spawn", spawn)
        monkeypatch.setattr(Processes, "stopped",
                            lambda hosts, instance: hosts.store.stop_requested(instance))


def running_query(state: Path, doc: dict) -> DirectoryStore:
    """A store where ``doc``'s query runs (as ``theseus run`` records it), in this process."""
    store = DirectoryStore(state)
    store.put_plan(doc["query"], dumps(load_plan_doc(state.parent, doc)))
    store.set_status(doc["query"], status="running", pid=os.getpid(), generation=0)
    return store


def load_plan_doc(folder: Path, doc: dict):
    p = folder / f"_{doc['query']}_running.json"
    p.write_text(json.dumps(doc))
    return load_plan(str(p))
