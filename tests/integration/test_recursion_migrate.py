"""A recursive query migrated live, judged exactly against networkx over the input split at
the recorded cut.

The old query counts every node's descendants from a stream of child -> parent edges (the
KIP-857 example: a recursive step climbing the edges, an aggregate after it). The new plan
changes the recursion's body: each derived (ancestor, node) pair carries its depth, and the
aggregate adds the height of the node's subtree (``max(depth)``).  The edges of a random
forest arrive in random order: some before the old query starts, more all through the
migration, the rest after it.  Afterwards, with C the cut in the edges topic:

- every key's rows from the old query come before its rows from the new one, and its last
  old row is the descendant count over the edges before C (networkx), for exactly the nodes
  that have descendants there;
- the new query writes exactly the nodes whose descendants changed from C on, every row of
  it with the height, its last row the count and height over all edges (the new body over
  all history), so the output's last row per key is the new plan over all input where the
  input after C touched the key, and the old plan (equal to it) elsewhere;
- the internal topics are cut where the loops finished C: the old loop's topic holds before
  its control events C' exactly the pairs of the edges before C; the shadow loop's topic
  holds before C'' the pairs with depths of the edges before C, after it exactly the pairs
  the edges from C on added, each once.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import uuid
from collections import defaultdict

import networkx as nx
import pytest

from tests.integration.test_migration import spawn_run, theseus, wait_for
from tests.integration.test_recursion import random_forest
from tests.recursion_util import plan

pytestmark = [pytest.mark.integration, pytest.mark.own_jvm]


class Edges(threading.Thread):
    """Produces the edges one by one (``per_second``) until stopped or out of edges."""

    def __init__(self, bootstrap: str, topic: str, edges: list[dict],
                 per_second: float) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Producer

        self.p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
        self.topic, self.todo, self.pause = topic, list(edges), 1.0 / per_second
        self.halt = threading.Event()

    def run(self) -> None:
        while self.todo and not self.halt.is_set():
            self.p.produce(self.topic, json.dumps(self.todo.pop(0)))
            self.p.poll(0)
            self.halt.wait(self.pause)
        self.p.flush(30)

    def stop(self) -> list[dict]:
        """Stop; returns the edges not produced."""
        self.halt.set()
        self.join(60)
        return self.todo


def graph(edges) -> nx.DiGraph:
    g = nx.DiGraph()
    g.add_edges_from((e["parent"], e["child"]) for e in edges)
    return g


def pairs(g: nx.DiGraph, depth: bool) -> set:
    out = set()
    for a in g.nodes:
        for n, d in nx.single_source_shortest_path_length(g, a).items():
            if d:
                out.add((a, n, d) if depth else (a, n))
    return out


def test_a_recursive_query_migrates_live_at_an_exact_cut(kafka, tmp_path):
    from gates.control import is_control
    from gates.state import is_acked
    from migrate import migration
    from migrate.store import DirectoryStore

    t0 = time.monotonic()
    rng = random.Random(1414)
    forest = random_forest(rng, 300, 6)
    edges = [{"child": c, "parent": p} for p, c in forest.edges]
    rng.shuffle(edges)
    src = kafka.topic(prefix="recmig-edges", partitions=2)
    out = kafka.topic(prefix="recmig-out", partitions=2)
    state = tmp_path / "state"
    # unique per run: the loops' internal topics are named by the query and the checkpoint
    # path, and outlive a run (a second run in the same --basetemp would read the first's)
    query = f"rm_{uuid.uuid4().hex[:8]}"
    old_p, new_p = tmp_path / "v1.json", tmp_path / "v2.json"
    old_p.write_text(json.dumps(plan(query, src, out, False)))
    new_p.write_text(json.dumps(plan(query, src, out, True)))
    chk = theseus("check", str(old_p), str(new_p), "--format", "json")
    assert chk.returncode == 1 and json.loads(chk.stdout)["verdict"] == "migrate", chk.stdout

    kafka.produce(src, edges[:40])  # before the old query starts
    later = edges[-40:]  # after the migration
    feeder = Edges(kafka.bootstrap, src, edges[40:-40], per_second=1.0)  # meanwhile
    feeder.start()
    old = spawn_run(old_p, kafka.bootstrap, state)
    store = DirectoryStore(state)
    try:
        wait_for(lambda: store.status(query).get("status") == "running", 180, "old query up")
        time.sleep(3)
        r = theseus("migrate", "start", str(new_p), "--bootstrap", kafka.bootstrap, "--state",
                    str(state), "--reconcile", "off", "--timeout", "300",
                    env=dict(os.environ), timeout=400)
        assert r.returncode == 0, r.stdout + r.stderr
        m = migration.current(store, query)
        assert m.phase == "done" and store.live_instance(query) == m.new_instance
        assert "cut the old loop's topic: C'" in r.stdout, r.stdout
        time.sleep(3)
        kafka.produce(src, feeder.stop() + later)
        new = m.new_instance
        loops_old = store.status(m.old_instance)["loops"]["closure"]
        loops_new = store.status(new)["loops"]["closure"]
        wait_for(lambda: is_acked(state, loops_new["gate"], {src: kafka.end_offsets(src)}),
                 180, "the new loop drains the edges")
        t_new = loops_new["topic"]
        wait_for(lambda: is_acked(state, new, {t_new: kafka.end_offsets(t_new)}), 180,
                 "the new output query drains its loop's topic")
        assert theseus("stop", query, "--state", str(state)).returncode == 0
        wait_for(lambda: store.status(new).get("status") == "stopped", 120, "new stops")
        old.wait(60)
    finally:
        feeder.halt.set()
        if old.poll() is None:
            old.kill()
        for inst in (query, f"{query}.g1"):  # a shadow the migrator left running
            pid = store.status(inst).get("pid")
            if pid and store.status(inst).get("status") in ("starting", "running"):
                try:
                    os.kill(int(pid), 9)
                except ProcessLookupError:
                    pass
        internal = [lp["topic"] for inst in (query, f"{query}.g1")
                    for lp in (store.status(inst).get("loops") or {}).values()]
        kafka.created.extend(internal)  # deleted with the test's own topics

    # -- the oracle ------------------------------------------------------------------------
    cut = m.cut[src]
    records = [r for r in kafka.read_all(src) if not is_control(r.headers)]
    pre = [r.json() for r in records if r.offset < cut[str(r.partition)]]
    g_pre, g_all = graph(pre), graph([r.json() for r in records])
    # edges before the old query, before the cut while it ran, and after the cut both
    # during the migration (from the feeder) and after it
    assert len(records) == len(edges) and 40 < len(pre) < len(edges) - len(later) - 10
    desc_pre = {v: len(nx.descendants(g_pre, v)) for v in g_pre if nx.descendants(g_pre, v)}
    desc_all = {v: len(nx.descendants(g_all, v)) for v in g_all if nx.descendants(g_all, v)}
    height = {v: max(nx.single_source_shortest_path_length(g_all, v).values())
              for v in desc_all}
    changed = {v for v in desc_all if desc_all[v] != desc_pre.get(v)}
    assert changed and desc_pre

    rows: dict = defaultdict(list)
    for r in sorted(kafka.read_all(out), key=lambda r: (r.partition, r.offset)):
        rows[r.key_json()["node"]].append(r.json())
    olds = {k: [v for v in vs if "height" not in v] for k, vs in rows.items()}
    news = {k: [v for v in vs if "height" in v] for k, vs in rows.items()}
    assert {k for k, vs in olds.items() if vs} == set(desc_pre)
    assert {k for k, vs in news.items() if vs} == changed
    for k, vs in rows.items():
        n_old = len(olds[k])
        assert all("height" not in v for v in vs[:n_old]), f"{k}: an old row after a new one"
        if olds[k]:  # the old plan over the input before the cut
            assert olds[k][-1] == {"node": k, "descendants": desc_pre[k]}, (k, olds[k])
        if news[k]:  # the new plan over all history
            assert news[k][-1] == {"node": k, "descendants": desc_all[k],
                                   "height": height[k]}, (k, news[k])
            assert all(v["descendants"] >= desc_pre.get(k, 0) for v in news[k]), news[k]

    # -- the internal topics are cut where the loops finished C ----------------------------
    def split(topic: str, at: dict) -> tuple[list, list]:
        data = [r for r in kafka.read_all(topic) if not is_control(r.headers)]
        ctl = [r for r in kafka.read_all(topic) if is_control(r.headers)]
        assert {(r.partition, r.offset) for r in ctl} == {(int(p), o) for p, o in at.items()}
        return ([r.json() for r in data if r.offset < at[str(r.partition)]],
                [r.json() for r in data if r.offset > at[str(r.partition)]])

    # C' is recorded just past the old loop's control events (the old output query may read
    # them before its cap: its hand-over needs its acknowledgement exactly at C')
    c1 = {p: o - 1 for p, o in m.output_cuts["old"][loops_old["topic"]].items()}
    c2 = m.output_cuts["new"][t_new]
    before, after = split(loops_old["topic"], c1)
    assert sorted((v["anc"], v["node"]) for v in before) == sorted(pairs(g_pre, False))
    assert after == []  # the old loop stopped at C
    before, after = split(t_new, c2)
    key = ("anc", "node", "depth")
    assert sorted(tuple(v[c] for c in key) for v in before) == sorted(pairs(g_pre, True))
    assert sorted(tuple(v[c] for c in key) for v in after) == \
        sorted(pairs(g_all, True) - pairs(g_pre, True))
    took = time.monotonic() - t0
    print(f"recursive live migration test: {took:.0f} s, {len(pre)} of {len(edges)} edges "
          f"before the cut, {len(changed)} nodes changed after it")
