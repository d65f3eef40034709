"""The plans of the recursive query's live migration (issue 14), shared by the unit tests of
the migrator's steps and the integration oracle test."""

from __future__ import annotations


def plan(query: str, edges: str, out: str, new: bool) -> dict:
    base = [{"name": "anc", "expr": "parent"}, {"name": "node", "expr": "child"}]
    up = [{"name": "anc", "expr": "parent"}, {"name": "node", "expr": "node"}]
    aggs = [{"name": "descendants", "function": "count", "args": ["node"]}]
    if new:
        base.append({"name": "depth", "expr": "1"})
        up.append({"name": "depth", "expr": "depth + 1"})
        aggs.append({"name": "height", "function": "max", "args": ["depth"]})
    return {
        "format": "theseus.plan/1", "query": query, "config": {"state_partitions": 2},
        "nodes": [
            {"id": "edges", "step": "source", "version": 1, "topic": edges, "partitions": 2,
             "format": "json", "role": "stream",
             "schema": [{"name": "child", "type": "string"},
                        {"name": "parent", "type": "string"}]},
            {"id": "base", "step": "project", "version": 1, "inputs": ["edges"],
             "columns": base},
            {"id": "closure", "step": "recursive", "version": 2, "inputs": ["base", "edges"],
             "body_input": "r", "body_output": "up", "body": [
                 {"id": "j", "step": "join", "version": 1, "inputs": ["r", "edges"],
                  "type": "inner", "left_keys": ["anc"], "right_keys": ["child"]},
                 {"id": "up", "step": "project", "version": 1, "inputs": ["j"],
                  "columns": up}]},
            {"id": "counts", "step": "aggregate", "version": 1, "inputs": ["closure"],
             "group_by": [{"name": "node", "expr": "anc"}], "aggregates": aggs},
            {"id": "out", "step": "sink", "version": 1, "inputs": ["counts"], "topic": out,
             "format": "json", "key_columns": ["node"], "mode": "update",
             "delivery": "exactly_once"}]}
