"""Small plans for the fleet's tests, built from node documents."""

from __future__ import annotations

import copy
from typing import Any

from compat.infer import analyze
from compat.model import Plan
from compat.serde import from_doc

ORDERS = [{"name": "order_id", "type": "string"}, {"name": "a", "type": "int"},
          {"name": "b", "type": "int"}, {"name": "region", "type": "string"},
          {"name": "ts", "type": "timestamp"}]


def source(nid: str = "src", topic: str = "orders", partitions: int = 3,
           schema: list[dict[str, Any]] | None = None, **kw: Any) -> dict[str, Any]:
    return {"id": nid, "step": "source", "topic": topic, "partitions": partitions,
            "format": "json", "role": "stream", "schema": schema or ORDERS, **kw}


def filt(nid: str, inp: str, predicate: str) -> dict[str, Any]:
    return {"id": nid, "step": "filter", "inputs": [inp], "predicate": predicate}


def proj(nid: str, inp: str, *cols: tuple[str, str]) -> dict[str, Any]:
    return {"id": nid, "step": "project", "inputs": [inp],
            "columns": [{"name": n, "expr": e} for n, e in cols]}


def agg(nid: str, inp: str, group: list[tuple[str, str]],
        aggs: list[tuple[str, str, list[str]]]) -> dict[str, Any]:
    return {"id": nid, "step": "aggregate", "inputs": [inp],
            "group_by": [{"name": n, "expr": e} for n, e in group],
            "aggregates": [{"name": n, "function": f, "args": a} for n, f, a in aggs]}


def sink(nid: str, inp: str, topic: str, mode: str = "append",
         keys: list[str] | None = None) -> dict[str, Any]:
    return {"id": nid, "step": "sink", "inputs": [inp], "topic": topic, "format": "json",
            "key_columns": keys or [], "mode": mode, "delivery": "exactly_once"}


def plan(query: str, *nodes: dict[str, Any]) -> Plan:
    doc = {"format": "theseus.plan/1", "query": query, "config": {"state_partitions": 2},
           "nodes": [{"version": 1, **copy.deepcopy(n)} for n in nodes]}
    p = from_doc(doc, f"{query}.json")
    analyze(p)
    return p


def doc(query: str, *nodes: dict[str, Any]) -> dict[str, Any]:
    return {"format": "theseus.plan/1", "query": query, "config": {"state_partitions": 2},
            "nodes": [{"version": 1, **copy.deepcopy(n)} for n in nodes]}
