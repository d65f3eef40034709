"""Recursive steps on real Spark and Kafka, judged against networkx.

Random forests (descendant counts) and random graphs with cycles (transitive closure), edges
shuffled into random order and split over several micro-batches (a small
``max_records_per_batch``); a late edge in the middle of a tree; a body that derives nothing;
an empty input; the limit behaviours.  Data stays small (tens of edges): Spark's per-job cost,
not the data, decides the time."""

from __future__ import annotations

import copy
import json
import random
from collections import Counter
from pathlib import Path

import networkx as nx
import pytest

from compat.infer import analyze
from compat.serde import from_doc
from tests.recursion_util import reach_through_allowed

ROOT = Path(__file__).resolve().parents[2]
DESCENDANTS = json.loads((ROOT / "fixtures" / "qtt" / "recursive_descendants" / "plan.json")
                         .read_text())
CLOSURE = json.loads((ROOT / "fixtures" / "qtt" / "recursive_closure_cycle" / "plan.json")
                     .read_text())

pytestmark = pytest.mark.integration


def _node(doc: dict, nid: str) -> dict:
    return next(n for n in doc["nodes"] if n["id"] == nid)


def start(doc: dict, kafka, spark, tmp_path: Path, inputs: dict[str, list], *,
          max_records: int = 1000, checkpoint: Path | None = None, topics: dict | None = None,
          available_now: bool = True):
    """Rename the plan's topics (unless ``topics`` gives them), produce ``inputs``, start
    the plan's query chain; returns (chain, plan, topics)."""
    from migrate.build import Builder, BuildOptions

    doc = copy.deepcopy(doc)
    topics = dict(topics or {})
    for n in doc["nodes"]:
        if n["step"] in ("source", "sink"):
            if n["topic"] not in topics:
                topics[n["topic"]] = kafka.topic(prefix=n["topic"].replace("_", "-"),
                                                 partitions=n.get("partitions", 1))
            n["topic"] = topics[n["topic"]]
    for t, values in inputs.items():
        if values:
            kafka.produce(topics[t], values)
    plan = from_doc(doc)
    analyze(plan)
    opts = BuildOptions(bootstrap=kafka.bootstrap, query=f"rec-{tmp_path.name}"[-60:],
                        available_now=available_now,
                        checkpoint=str(checkpoint or tmp_path / "ck"),
                        max_records_per_batch=max_records)
    chain = Builder(spark, plan, opts).start()
    return chain, plan, topics


def finish(chain, timeout: float = 300) -> list[str]:
    assert chain.awaitTermination(timeout), "the recursive plan did not finish in time"
    notes = chain.notes()
    assert chain.exception() is None, chain.exception()
    return notes


def ran_as_sql(notes: list[str]) -> bool:
    """Whether every loop batch ran as WITH RECURSIVE queries (not the DataFrame loop):
    the body of each test that says so fits them, and a fallback would pass unseen."""
    batches = [n for n in notes if " new rows in " in n]
    return bool(batches) and all("(WITH RECURSIVE: " in n for n in batches)


def table(kafka, topic: str) -> dict:
    """The final value per key (records in offset order per partition)."""
    out: dict = {}
    for r in sorted(kafka.read_all(topic), key=lambda r: (r.partition, r.offset)):
        k = json.dumps(r.key_json(), sort_keys=True)
        if r.value is None:
            out.pop(k, None)
        else:
            out[k] = r.json()
    return out


def random_forest(rng: random.Random, n: int, depth: int) -> nx.DiGraph:
    """Trees of random shape, parent -> child edges, no node deeper than ``depth``."""
    g = nx.DiGraph()
    level = {}
    for i in range(n):
        name = f"n{i}"
        g.add_node(name)
        parents = [p for p in list(g.nodes)[:-1] if level[p] < depth]
        if parents and rng.random() < 0.85:
            p = rng.choice(parents)
            g.add_edge(p, name)
            level[name] = level[p] + 1
        else:
            level[name] = 0
    return g


def edges_of(g: nx.DiGraph, rng: random.Random) -> list[dict]:
    edges = [{"child": c, "parent": p} for p, c in g.edges]
    rng.shuffle(edges)
    return edges


def descendant_counts(g: nx.DiGraph) -> dict:
    return {json.dumps({"node": v}): {"node": v, "descendants": len(nx.descendants(g, v))}
            for v in g.nodes if nx.descendants(g, v)}


@pytest.mark.parametrize("seed", [7])
def test_descendant_counts_of_a_random_forest_match_networkx(seed, kafka, spark, tmp_path):
    rng = random.Random(seed)
    g = random_forest(rng, 60, 6)
    edges = edges_of(g, rng)
    chain, plan, topics = start(DESCENDANTS, kafka, spark, tmp_path, {"edges": edges},
                                max_records=12)  # several micro-batches
    notes = finish(chain)
    assert sum("recursive 'closure' batch" in n for n in notes) >= 3, notes
    assert ran_as_sql(notes), notes
    assert table(kafka, plan.sink.topic) == descendant_counts(g)


@pytest.mark.parametrize("linear", [True, False])
def test_transitive_closure_of_a_graph_with_cycles_matches_networkx(linear, kafka, spark,
                                                                   tmp_path):
    """Set semantics over cycles, as WITH RECURSIVE queries (which go round a cycle until
    their chunk of levels ends) and, for a body that also keeps the loop's rows (read along
    two paths: not linear, so not SQL), by the DataFrame loop: the same closure."""
    doc = copy.deepcopy(CLOSURE)
    if not linear:
        rec = _node(doc, "reach")
        rec["body"].append({"id": "again", "step": "union", "version": 1,
                            "inputs": ["further", "r"]})
        rec["body_output"] = "again"
    rng = random.Random(14)
    g = nx.gnm_random_graph(18, 30, seed=14, directed=True)
    g = nx.relabel_nodes(g, {v: f"v{v}" for v in g.nodes})
    assert not nx.is_directed_acyclic_graph(g)  # cycles: set semantics must terminate
    edges = [{"src": a, "dst": b} for a, b in g.edges]
    rng.shuffle(edges)
    chain, plan, _ = start(doc, kafka, spark, tmp_path, {"links": edges}, max_records=8)
    notes = finish(chain)
    assert ran_as_sql(notes) if linear else \
        all("(DataFrame loop: the body reads an input along several paths" in n
            for n in notes if " new rows in " in n), notes
    got = Counter((r.json()["src"], r.json()["dst"]) for r in kafka.read_all(plan.sink.topic))
    # a node reaches itself when it lies on a cycle: its strongly connected component has
    # another node or a self-loop (networkx 3.6's transitive_closure(reflexive=None) misses
    # some of these, so it is computed here)
    on_cycle = {v for c in nx.strongly_connected_components(g) for v in c
                if len(c) > 1 or g.has_edge(v, v)}
    want = {(u, v) for u in g for v in nx.descendants(g, u)} | {(v, v) for v in on_cycle}
    assert on_cycle  # the case this test is about
    assert set(got) == want
    assert max(got.values()) == 1  # each pair once: set semantics, exactly once


def test_a_late_edge_in_the_middle_updates_every_ancestor(kafka, spark, tmp_path):
    """Two chains a<-b<-c and d<-e<-f run to the fixpoint; then the edge c<-d arrives and
    the restarted query (same checkpoint: the loop's state) adds d, e, f under a, b, c."""
    first = [{"child": "b", "parent": "a"}, {"child": "c", "parent": "b"},
             {"child": "e", "parent": "d"}, {"child": "f", "parent": "e"}]
    chain, plan, topics = start(DESCENDANTS, kafka, spark, tmp_path, {"edges": first})
    finish(chain)
    assert {json.loads(k)["node"]: v["descendants"]
            for k, v in table(kafka, plan.sink.topic).items()} == \
        {"a": 2, "b": 1, "d": 2, "e": 1}
    chain, _, _ = start(DESCENDANTS, kafka, spark, tmp_path,
                        {"edges": [{"child": "d", "parent": "c"}]}, topics=topics)
    notes = finish(chain)
    assert any("3 new rows" in n or "new rows" in n for n in notes)
    assert {json.loads(k)["node"]: v["descendants"]
            for k, v in table(kafka, plan.sink.topic).items()} == \
        {"a": 5, "b": 4, "c": 3, "d": 2, "e": 1}


def _hops(max_iterations: int, on_limit: str, bound: str | None) -> dict:
    """Bag semantics: each package row hops on, one row per hop."""
    body = [{"id": "next", "step": "project", "version": 1, "inputs": ["hop"],
             "columns": [{"name": "package_id", "expr": "package_id"},
                         {"name": "hops", "expr": "hops + 1"}]}]
    if bound:
        body.append({"id": "bounded", "step": "filter", "version": 1, "inputs": ["next"],
                     "predicate": bound})
    return {
        "format": "theseus.plan/1", "query": "hops", "config": {"state_partitions": 2},
        "nodes": [
            {"id": "packages", "step": "source", "version": 1, "topic": "packages",
             "partitions": 1, "format": "json", "role": "stream",
             "schema": [{"name": "package_id", "type": "string"},
                        {"name": "hops", "type": "int"}]},
            {"id": "route", "step": "recursive", "version": 2, "inputs": ["packages"],
             "body_input": "hop", "body_output": body[-1]["id"], "union": "bag",
             "max_iterations": max_iterations, "on_limit": on_limit, "body": body},
            {"id": "out", "step": "sink", "version": 1, "inputs": ["route"],
             "topic": "routes", "format": "json", "key_columns": [], "mode": "append",
             "delivery": "exactly_once"}]}


def _rows(kafka, plan) -> Counter:
    return Counter((r.json()["package_id"], r.json()["hops"])
                   for r in kafka.read_all(plan.sink.topic))


def test_on_limit_return_keeps_what_was_derived_and_warns(kafka, spark, tmp_path):
    chain, plan, _ = start(_hops(4, "return", None), kafka, spark, tmp_path,
                           {"packages": [{"package_id": "p", "hops": 0}]})
    notes = finish(chain)
    assert ran_as_sql(notes), notes
    assert _rows(kafka, plan) == Counter({("p", h): 1 for h in range(5)})
    assert any("warning" in n and "max_iterations=4" in n and "'route'" in n for n in notes)


def test_on_limit_error_stops_the_query_naming_the_step(kafka, spark, tmp_path):
    chain, plan, _ = start(_hops(4, "error", None), kafka, spark, tmp_path,
                           {"packages": [{"package_id": "p", "hops": 0}]})
    assert chain.awaitTermination(300)
    exc = chain.exception()
    assert exc is not None
    from migrate.run import failure_message

    msg = failure_message(str(exc))
    assert "recursive step 'route'" in msg and "max_iterations=4" in msg, msg
    assert _rows(kafka, plan) == Counter()  # nothing of the failed batch is written


def test_a_bag_loop_ends_when_the_body_derives_nothing(kafka, spark, tmp_path):
    """Within the limit a bag loop ends at its own fixpoint: every hop once, per package
    (two packages with the same row each count: bag semantics)."""
    chain, plan, _ = start(_hops(100, "error", "hops < 3"), kafka, spark, tmp_path,
                           {"packages": [{"package_id": "p", "hops": 0},
                                         {"package_id": "p", "hops": 0},
                                         {"package_id": "q", "hops": 2}]})
    notes = finish(chain)
    assert _rows(kafka, plan) == Counter({("p", 0): 2, ("p", 1): 2, ("p", 2): 2,
                                          ("q", 2): 1})
    assert not any("warning" in n for n in notes)


def test_a_body_that_derives_nothing_outputs_the_base_and_an_empty_input_nothing(
        kafka, spark, tmp_path):
    chain, plan, _ = start(_hops(100, "error", "hops < 0"), kafka, spark, tmp_path / "a",
                           {"packages": [{"package_id": "p", "hops": 5}]})
    finish(chain)
    assert _rows(kafka, plan) == Counter({("p", 5): 1})
    chain, plan, _ = start(DESCENDANTS, kafka, spark, tmp_path / "b", {"edges": []})
    finish(chain)
    assert table(kafka, plan.sink.topic) == {}


@pytest.mark.own_jvm
def test_the_loop_state_survives_sigkill_exactly_once(kafka, tmp_path):
    """SIGKILL the recursive plan twice — inside the loop sink's transaction (the batch's
    state already written), then after a commit before Spark records the batch — and run it
    to the end on the same checkpoint: every closure pair once, none missing."""
    import os
    import signal
    import subprocess
    import time
    import uuid

    from tests.integration.conftest import PYTHON, jvm_running, spark_env
    from tests.integration.test_gates import _group_gone, _wait_for

    if jvm_running():
        pytest.skip("a Spark JVM already runs in this process; run this test on its own "
                    "(it is ordered first in a full run)")
    g = nx.gnm_random_graph(16, 26, seed=3, directed=True)
    g = nx.relabel_nodes(g, {v: f"v{v}" for v in g.nodes})
    edges = [{"src": a, "dst": b} for a, b in g.edges]
    random.Random(3).shuffle(edges)
    doc = copy.deepcopy(CLOSURE)
    links, out = kafka.topic("kill-links", 2), kafka.topic("kill-reach", 2)
    for n in doc["nodes"]:
        if n["step"] == "source":
            n["topic"] = links
        if n["step"] == "sink":
            n["topic"] = out
    kafka.produce(links, edges[:20])
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(doc))
    sig = tmp_path / "signals"
    sig.mkdir()
    job = [PYTHON, str(Path(__file__).with_name("recursion_kill_job.py")),
           "--bootstrap", kafka.bootstrap, "--plan", str(plan_path),
           "--checkpoint", str(tmp_path / "ck"), "--query", f"rk-{uuid.uuid4().hex[:6]}",
           "--signal-dir", str(sig), "--max-records", "4"]
    logs: list[Path] = []

    def run(extra, kill_on=None, timeout=300):
        log = tmp_path / f"job{len(logs)}.log"
        logs.append(log)
        with open(log, "w") as f:
            p = subprocess.Popen(job + extra, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                                 env=spark_env(), start_new_session=True)
        try:
            if kill_on is None:
                rc = p.wait(timeout)
                assert rc == 0, f"job failed ({rc}):\n{log.read_text()[-4000:]}"
                return
            _wait_for(lambda: any(sig.glob(f"{kill_on}-*")) or p.poll() is not None,
                      timeout, f"the job to reach {kill_on}")
            assert p.poll() is None, f"job ended early:\n{log.read_text()[-4000:]}"
            time.sleep(0.5)
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(30)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(30)
            _wait_for(lambda: _group_gone(p.pid), 60, "the killed job's JVM to exit")

    run(["--hold", "in_txn", "--hold-from", "1"], kill_on="in_txn")
    run(["--hold", "after_commit", "--hold-from", "3"], kill_on="after_commit")
    kafka.produce(links, edges[20:])  # more edges while the query is down
    run([])
    assert "already committed" in logs[-1].read_text(), \
        "the batch committed before the second kill should have been replayed and skipped"
    got = Counter((r.json()["src"], r.json()["dst"]) for r in kafka.read_all(out))
    on_cycle = {v for c in nx.strongly_connected_components(g) for v in c
                if len(c) > 1 or g.has_edge(v, v)}
    want = {(u, v) for u in g for v in nx.descendants(g, u)} | {(v, v) for v in on_cycle}
    assert set(got) == want, (set(got) ^ want)
    dups = {k: n for k, n in got.items() if n > 1}
    assert not dups, f"duplicates: {list(dups.items())[:10]}"


def test_theseus_run_available_now_prints_the_loop_and_ends_at_the_fixpoint(kafka, spark,
                                                                           tmp_path):
    """The query host (``theseus run --available-now``) runs a recursive plan from the SQL
    compiler's JSON: one progress line per loop batch, exit 0, the fixpoint in the output."""
    from compat.sql import compile_sql
    from migrate.run import run

    sql = (ROOT / "fixtures/history/recursive_descendants/v1/query.sql").read_text()
    doc = compile_sql(sql, "q.sql")
    edges, out = kafka.topic("run-edges", 2), kafka.topic("run-counts", 2)
    for n in doc["nodes"]:
        if n["step"] in ("source", "sink"):
            n["topic"] = edges if n["step"] == "source" else out
    doc["query"] = f"run-{tmp_path.name}"[-40:]
    rng = random.Random(5)
    g = random_forest(rng, 30, 5)
    kafka.produce(edges, edges_of(g, rng))
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    lines: list[str] = []
    assert run(str(path), bootstrap=kafka.bootstrap, state=str(tmp_path / "state"),
               available_now=True, echo=lines.append) == 0
    assert any("recursive 'closure_1' batch 0:" in ln for ln in lines), lines
    assert table(kafka, out) == descendant_counts(g)


def test_the_body_joins_a_table_read_as_of_each_batch(kafka, spark, tmp_path):
    """Every manager above each asked employee: the body climbs a ``role: table`` of
    employee -> manager (latest value per key: a corrected manager counts, the old one
    not) — networkx's ancestors of the final table, plus the employee itself."""
    doc = {
        "format": "theseus.plan/1", "query": "chains", "config": {"state_partitions": 2},
        "nodes": [
            {"id": "reports_to", "step": "source", "version": 1, "topic": "reports_to",
             "partitions": 1, "format": "json", "role": "table", "key_columns": ["employee"],
             "schema": [{"name": "employee", "type": "string"},
                        {"name": "manager", "type": "string"}]},
            {"id": "asks", "step": "source", "version": 1, "topic": "asks", "partitions": 1,
             "format": "json", "role": "stream", "schema": [{"name": "who", "type": "string"}]},
            {"id": "me", "step": "project", "version": 1, "inputs": ["asks"],
             "columns": [{"name": "who", "expr": "who"}, {"name": "boss", "expr": "who"}]},
            {"id": "above", "step": "recursive", "version": 2, "inputs": ["me", "reports_to"],
             "body_input": "r", "body_output": "up", "body": [
                 {"id": "j", "step": "join", "version": 1, "inputs": ["r", "reports_to"],
                  "type": "inner", "left_keys": ["boss"], "right_keys": ["employee"]},
                 {"id": "up", "step": "project", "version": 1, "inputs": ["j"],
                  "columns": [{"name": "who", "expr": "who"},
                              {"name": "boss", "expr": "manager"}]}]},
            {"id": "out", "step": "sink", "version": 1, "inputs": ["above"], "topic": "bosses",
             "format": "json", "key_columns": ["who", "boss"], "mode": "append",
             "delivery": "exactly_once"}]}
    rng = random.Random(11)
    g = random_forest(rng, 25, 5)
    rows = [{"employee": c, "manager": p} for p, c in g.edges]
    # a wrong manager first, corrected later in the topic: the table keeps the last value
    wrong = {"employee": rows[0]["employee"], "manager": "nobody"}
    topics = {t: kafka.topic(prefix=t.replace("_", "-"), partitions=1)
              for t in ("reports_to", "asks", "bosses")}
    kafka.produce(topics["reports_to"], [wrong] + rows,
                  keys=[{"employee": r["employee"]} for r in [wrong] + rows])
    asked = sorted(g.nodes)[::2]
    chain, plan, _ = start(doc, kafka, spark, tmp_path, {"asks": [{"who": w} for w in asked]},
                           topics=topics, max_records=5)
    finish(chain)
    got = Counter((r.json()["who"], r.json()["boss"]) for r in kafka.read_all(topics["bosses"]))
    want = {(w, b) for w in asked for b in nx.ancestors(g, w) | {w}}
    assert set(got) == want and max(got.values()) == 1


def test_a_body_with_union_explode_and_a_left_semi_join_matches_networkx(kafka, spark,
                                                                        tmp_path):
    """Every node each asked node reaches along edges that leave allowed nodes only, over
    a random graph with cycles whose edges arrive half as exploded neighbour arrays, half
    as single links, all four streams shuffled and split over several micro-batches (an
    allowed node or an edge may arrive after the paths it extends): networkx's descendants
    in the graph of the allowed nodes' out-edges."""
    rng = random.Random(1414)
    g = nx.gnm_random_graph(16, 30, seed=1414, directed=True)
    g = nx.relabel_nodes(g, {v: f"v{v}" for v in g.nodes})
    assert not nx.is_directed_acyclic_graph(g)
    nodes = sorted(g.nodes)
    as_array = set(rng.sample(nodes, 8))  # these nodes' out-edges come as one adj row
    adj = [{"node": v, "nbrs": sorted(g.successors(v))} for v in as_array
           if g.out_degree(v)]
    links = [{"src": a, "dst": b} for a, b in g.edges if a not in as_array]
    allowed = set(rng.sample(nodes, 12))
    asked = rng.sample(nodes, 4)
    inputs = {"adj": adj, "links": links, "allowed": [{"node": v} for v in allowed],
              "starts": [{"who": w} for w in asked]}
    for rows in inputs.values():
        rng.shuffle(rows)
    # the union and the semi join both matter here: paths use both kinds of edges, and
    # some edges leave a node that is not allowed
    assert adj and links and any(a not in allowed for a, _ in g.edges)
    chain, plan, _ = start(reach_through_allowed(), kafka, spark, tmp_path, inputs,
                           max_records=4)
    notes = finish(chain)
    assert sum("recursive 'reach' batch" in n for n in notes) >= 3, notes
    assert ran_as_sql(notes), notes

    def reached(edges) -> set:
        h = nx.DiGraph()
        h.add_nodes_from(nodes)
        h.add_edges_from(edges)
        return {(s, t) for s in asked for t in nx.descendants(h, s) | {s}}

    want = reached((a, b) for a, b in g.edges if a in allowed)
    # the answer differs without the semi join and without either branch of the union
    assert want != reached(g.edges)
    assert want != reached((a, b) for a, b in g.edges if a in allowed and a in as_array)
    assert want != reached((a, b) for a, b in g.edges if a in allowed and a not in as_array)
    got = Counter((r.json()["src"], r.json()["dst"]) for r in kafka.read_all(plan.sink.topic))
    assert set(got) == want, (set(got) ^ want)
    assert max(got.values()) == 1


def test_rows_with_nulls_on_a_cycle_are_each_known_once(kafka, spark, tmp_path):
    """Set semantics compares rows as ``subtract`` does, nulls equal to nulls: rows holding
    a null that the body derives again around a cycle (``(None, a)`` reaches a, b, c and a
    again) end the loop, and a row with a null that arrives again in a later micro-batch is
    not written twice."""
    links = [("a", "b"), ("b", "c"), ("c", "a"), (None, "a"), ("b", None), (None, None)]
    rows = [{"src": s, "dst": d} for s, d in links] * 3  # each again in later batches
    random.Random(31).shuffle(rows)
    doc = copy.deepcopy(CLOSURE)
    _node(doc, "reach")["max_iterations"] = 50
    _node(doc, "reach")["on_limit"] = "error"
    chain, plan, _ = start(doc, kafka, spark, tmp_path, {"links": rows}, max_records=4)
    notes = finish(chain)
    assert sum("recursive 'reach' batch" in n for n in notes) >= 3, notes
    assert ran_as_sql(notes), notes
    want = set(links)
    while True:  # the closure in plain Python: a join key that is null matches nothing
        more = {(s, d2) for s, d in want for s2, d2 in links if d is not None and d == s2}
        if more <= want:
            break
        want |= more
    assert (None, "c") in want and ("a", None) in want  # nulls derived around the cycle
    got = Counter((r.json()["src"], r.json()["dst"]) for r in kafka.read_all(plan.sink.topic))
    assert set(got) == want, set(got) ^ want
    assert max(got.values()) == 1
