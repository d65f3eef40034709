"""Recursive plans shared by unit and integration tests: the recursive query's live
migration (issue 14), and a body with a union, an explode and a left-semi join."""

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


def reach_through_allowed() -> dict:
    """Reachability from asked nodes through allowed ones, over two kinds of edges: a row
    of ``adj`` carries a node's out-neighbours as an array (exploded in the body), a row of
    ``links`` one edge; the body unions the two, keeps the edges leaving an ``allowed`` node
    (a left-semi join with that stream), and extends the loop's paths along them."""
    def src(nid: str, schema: list[tuple[str, str]]) -> dict:
        return {"id": nid, "step": "source", "version": 1, "topic": nid, "partitions": 1,
                "format": "json", "role": "stream",
                "schema": [{"name": n, "type": t} for n, t in schema]}

    return {
        "format": "theseus.plan/1", "query": "reach_allowed", "config": {"state_partitions": 2},
        "nodes": [
            src("starts", [("who", "string")]),
            src("adj", [("node", "string"), ("nbrs", "array<string>")]),
            src("links", [("src", "string"), ("dst", "string")]),
            src("allowed", [("node", "string")]),
            {"id": "seed", "step": "project", "version": 1, "inputs": ["starts"],
             "columns": [{"name": "src", "expr": "who"}, {"name": "dst", "expr": "who"}]},
            {"id": "reach", "step": "recursive", "version": 2,
             "inputs": ["seed", "adj", "links", "allowed"],
             "body_input": "r", "body_output": "further", "body": [
                 {"id": "fanout", "step": "explode", "version": 1, "inputs": ["adj"],
                  "expr": "nbrs", "as": "nbr"},
                 {"id": "adj_edges", "step": "project", "version": 1, "inputs": ["fanout"],
                  "columns": [{"name": "a", "expr": "node"}, {"name": "b", "expr": "nbr"}]},
                 {"id": "link_edges", "step": "project", "version": 1, "inputs": ["links"],
                  "columns": [{"name": "a", "expr": "src"}, {"name": "b", "expr": "dst"}]},
                 {"id": "edges", "step": "union", "version": 1,
                  "inputs": ["adj_edges", "link_edges"]},
                 {"id": "open", "step": "join", "version": 1, "inputs": ["edges", "allowed"],
                  "type": "left_semi", "left_keys": ["a"], "right_keys": ["node"]},
                 {"id": "j", "step": "join", "version": 1, "inputs": ["r", "open"],
                  "type": "inner", "left_keys": ["dst"], "right_keys": ["a"]},
                 {"id": "further", "step": "project", "version": 1, "inputs": ["j"],
                  "columns": [{"name": "src", "expr": "src"}, {"name": "dst", "expr": "b"}]}]},
            {"id": "out", "step": "sink", "version": 1, "inputs": ["reach"],
             "topic": "reached", "format": "json", "key_columns": ["src", "dst"],
             "mode": "append", "delivery": "exactly_once"}]}
