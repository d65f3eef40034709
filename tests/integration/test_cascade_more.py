"""More cascades on real Kafka and real Spark, judged by oracles computed here in plain Python.

1. A chain of three queries, A -> B -> C, migrated with ``migrate start A2 B2 C2``:
   A is a stateless enrichment whose new plan adds a column ``grp`` (a function of the key
   *and* of each record's value), B a filter passing its input on (its new plan passes
   ``grp`` on too), C an aggregate whose new plan *groups by* ``grp`` instead of the key
   (the output's key column stays ``g``; its values change). Input flows throughout. The
   migrator is SIGKILLed right after A recorded its propagation (past A's point of no
   return): ``migrate abort`` through C is refused and touches nothing, ``migrate resume``
   through B finishes the chain. Afterwards every topic of the chain holds the old plan
   over the input before the cut and the new plan over the input from it, each input
   record once, and the compacted view of C's output is exactly the new C over the new B
   over the new A over *all* input: every new group (with the history, which only the
   shadows' side topics carried), every old key tombstoned.
2. A two-query cascade aborted after both shadows run (the downstream one reading the
   upstream shadow's side topic), with the upstream paused at its high watermarks, before
   any control event: both old queries run on and stay exact over all input, the shadows
   stop, the side topics are deleted, no control record was written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter

import pytest

from tests.integration.test_cascade import down_plan, up_plan
from tests.integration.test_migration import ROOT, theseus, wait_for
from tests.integration.test_reconcile import KEYS, LIVE, LiveKeys, compacted

pytestmark = [pytest.mark.integration, pytest.mark.own_jvm]

GRP = "concat(substr(k, 1, 2), '-', CAST(x % 3 AS STRING))"  # as the new A computes it
DROP_X = 2  # B drops the records with x = 2, old and new
OLD_TRIGGER = "2 seconds"  # the old queries' (the shadows run every second)


def grp(v: dict) -> str:
    return f"{v['k'][:2]}-{v['x'] % 3}"


def head_plan(query: str, src: str, mid: str, new: bool) -> dict:
    return up_plan(query, src, mid, new, added=("grp", GRP))


def middle_plan(query: str, mid: str, mid2: str, new: bool) -> dict:
    schema = [{"name": "k", "type": "string"}, {"name": "x", "type": "bigint"}]
    cols = [{"name": "k", "expr": "k"}, {"name": "x", "expr": "x"}]
    if new:
        schema.append({"name": "grp", "type": "string"})
        cols.append({"name": "grp", "expr": "grp"})
    return {"format": "theseus.plan/1", "query": query, "config": {"state_partitions": 2},
            "nodes": [
                {"id": "enriched", "step": "source", "version": 1, "topic": mid,
                 "partitions": 2, "format": "json", "role": "stream", "schema": schema},
                {"id": "keep", "step": "filter", "version": 1, "inputs": ["enriched"],
                 "predicate": f"x <> {DROP_X}"},
                {"id": "pass", "step": "project", "version": 1, "inputs": ["keep"],
                 "columns": cols},
                {"id": "out", "step": "sink", "version": 1, "inputs": ["pass"], "topic": mid2,
                 "format": "json", "key_columns": ["k"], "mode": "append",
                 "delivery": "exactly_once"}]}


def tail_plan(query: str, mid2: str, out: str, new: bool) -> dict:
    """Old: the sum per key (``g`` = k). New: the sum and count per ``grp`` (``g`` = grp)."""
    schema = [{"name": "k", "type": "string"}, {"name": "x", "type": "bigint"}]
    group = {"name": "g", "expr": "k"}
    aggs = [{"name": "s", "function": "sum", "args": ["x"]}]
    if new:
        schema.append({"name": "grp", "type": "string"})
        group = {"name": "g", "expr": "grp"}
        aggs.append({"name": "n", "function": "count", "args": ["*"]})
    return {"format": "theseus.plan/1", "query": query, "config": {"state_partitions": 2},
            "nodes": [
                {"id": "passed", "step": "source", "version": 1, "topic": mid2,
                 "partitions": 2, "format": "json", "role": "stream", "schema": schema},
                {"id": "per_group", "step": "aggregate", "version": 1, "inputs": ["passed"],
                 "group_by": [group], "aggregates": aggs},
                {"id": "out", "step": "sink", "version": 1, "inputs": ["per_group"],
                 "topic": out, "format": "json", "key_columns": ["g"], "mode": "update",
                 "delivery": "exactly_once"}]}


def spawn_old(plan_path, bootstrap: str, state) -> subprocess.Popen:
    """``theseus run`` as :func:`spawn_run`, every 2 s: a chain's old queries and its
    shadows share 2 cores, and the shadows' start-up and backfill are this test's time."""
    log = open(state.parent / f"{plan_path.stem}.log", "ab")
    return subprocess.Popen([sys.executable, "-m", "migrate.cli", "run", str(plan_path),
                             "--bootstrap", bootstrap, "--state", str(state),
                             "--trigger", OLD_TRIGGER],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def bag(rows) -> Counter:
    return Counter(json.dumps(v, sort_keys=True) for v in rows)


def write_plans(tmp_path, docs: dict[str, dict]) -> dict:
    paths = {}
    for name, doc in docs.items():
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(doc))
    return paths


def start_old_chain(kafka, paths, names, queries, src, state):
    """Input for every key before anything runs, the live keys' feeder, the old queries."""
    from migrate.store import DirectoryStore

    kafka.produce(src, [{"k": k, "x": i % 7 + 1} for i, k in enumerate(KEYS * 2)],
                  keys=[{"k": k} for k in KEYS * 2])
    feeder = LiveKeys(kafka.bootstrap, src)
    feeder.start()
    procs = [spawn_old(paths[n], kafka.bootstrap, state) for n in names]
    store = DirectoryStore(state)
    wait_for(lambda: all(store.status(q).get("status") == "running" for q in queries),
             300, "the old chain up")
    time.sleep(1)  # the old chain runs on while the shadows start
    return feeder, procs, store


def drain_and_stop(kafka, state, store, feeder, procs, chain: list[tuple[str, str, str]]):
    """More input, then every instance of ``chain`` ((query, instance, topic it reads))
    drains its input, upstream first, and stops."""
    from gates.state import is_acked

    time.sleep(1)
    feeder.stop()
    for _q, inst, topic in chain:
        wait_for(lambda inst=inst, topic=topic: is_acked(
            state, inst, {topic: kafka.end_offsets(topic)}), 180, f"{inst} drains {topic}")
    for q, inst, _ in chain:
        assert theseus("stop", q, "--state", str(state)).returncode == 0
        wait_for(lambda inst=inst: store.status(inst).get("status") == "stopped", 120,
                 f"{inst} stops")
    for p in procs:
        p.wait(60)


def split_at(records, cut: dict[str, int]):
    """The non-control records' values before and after ``cut`` (one topic)."""
    from gates.control import is_control

    data = [r for r in records if not is_control(r.headers)]
    return ([r.json() for r in data if r.offset < cut[str(r.partition)]],
            [r.json() for r in data if r.offset > cut[str(r.partition)]])


def check_tombstoned(records, cut: dict[str, int], mid: str) -> None:
    """The control events of the cut are at ``cut`` in ``records``' topic, each partition's
    tombstoned after it (the migration is done)."""
    from gates.control import control_key, is_control

    ctl = [r for r in records if is_control(r.headers)]
    assert {(r.partition, r.offset) for r in ctl if r.value is not None} == \
        {(int(p), o) for p, o in cut.items()}
    for p, o in cut.items():
        assert any(r.partition == int(p) and r.value is None and r.offset > o and
                   r.key == control_key(mid) for r in ctl), (p, o)


def test_a_three_query_chain_whose_last_query_groups_by_the_new_column(kafka, tmp_path):
    from confluent_kafka.admin import AdminClient

    from gates.control import is_control
    from migrate import migration

    t0 = time.monotonic()
    src = kafka.topic(prefix="cas3-in", partitions=3)
    mid = kafka.topic(prefix="cas3-mid", partitions=2)
    mid2 = kafka.topic(prefix="cas3-mid2", partitions=2)
    out = kafka.topic(prefix="cas3-out", partitions=2, config={"cleanup.policy": "compact"})
    state = tmp_path / "state"
    tag = tmp_path.name[-6:].replace("-", "_")
    a, b, c = f"a{tag}", f"b{tag}", f"c{tag}"
    paths = write_plans(tmp_path, {
        "a1": head_plan(a, src, mid, False), "a2": head_plan(a, src, mid, True),
        "b1": middle_plan(b, mid, mid2, False), "b2": middle_plan(b, mid, mid2, True),
        "c1": tail_plan(c, mid2, out, False), "c2": tail_plan(c, mid2, out, True)})
    feeder, procs, store = start_old_chain(kafka, paths, ["a1", "b1", "c1"], [a, b, c], src,
                                           state)
    # killed right after A recorded its propagation: A's old query finished the input
    # before A's cut, so the chain is past its point of no return
    r = theseus("migrate", "start", str(paths["a2"]), str(paths["b2"]), str(paths["c2"]),
                "--bootstrap", kafka.bootstrap, "--state", str(state), "--timeout", "500",
                env=dict(os.environ, THESEUS_FAULT="after:propagate"), timeout=700)
    assert r.returncode == -9, r.stdout + r.stderr
    before = {q: migration.current(store, q).phase for q in (a, b, c)}
    assert before[a] == "propagate", before
    r = theseus("migrate", "abort", c, "--state", str(state), timeout=300)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert "resume finishes" in r.stderr, r.stderr
    assert {q: migration.current(store, q).phase for q in (a, b, c)} == before
    assert all(store.status(migration.current(store, q).new_instance).get("status")
               == "running" for q in (a, b, c)), "abort stopped a shadow"
    r = theseus("migrate", "resume", b, "--state", str(state), "--timeout", "500",
                timeout=700)
    assert r.returncode == 0, r.stdout + r.stderr
    ms = {q: migration.current(store, q) for q in (a, b, c)}
    assert all(m.phase == "done" and m.cascade == ms[a].cascade for m in ms.values())
    status = theseus("migrate", "status", c, "--state", str(state))
    assert status.returncode == 0, status.stderr
    assert f"cascade {ms[a].cascade}: done ({a} -> {b} -> {c})" in status.stdout, \
        status.stdout
    insts = [store.live_instance(q) for q in (a, b, c)]
    assert insts == [ms[q].new_instance for q in (a, b, c)]
    drain_and_stop(kafka, state, store, feeder, procs,
                   [(a, insts[0], src), (b, insts[1], mid), (c, insts[2], mid2)])
    raw = {t: kafka.read_all(t) for t in (src, mid, mid2, out)}
    seconds = time.monotonic() - t0

    # the cuts: A's in its sources, propagated by A into mid (B's cut), by B into mid2 (C's)
    cut_s, cut_m, cut_m2 = ms[a].cut[src], ms[a].out_cut[mid], ms[b].out_cut[mid2]
    assert ms[b].cut == {mid: cut_m} and ms[c].cut == {mid2: cut_m2}
    inputs = [r for r in raw[src] if not is_control(r.headers)]
    pre = [r.json() for r in inputs if r.offset < cut_s[str(r.partition)]]
    post = [r.json() for r in inputs if r.offset >= cut_s[str(r.partition)]]
    assert {v["k"] for v in pre} == set(KEYS) and {v["k"] for v in post} == set(LIVE)
    check_tombstoned(raw[src], cut_s, ms[a].id)
    check_tombstoned(raw[mid], cut_m, ms[a].id)
    check_tombstoned(raw[mid2], cut_m2, ms[b].id)

    # A and B: the old plan over the input before the cut, the new one over the input
    # from it; every input record exactly once
    before_m, after_m = split_at(raw[mid], cut_m)
    assert bag(before_m) == bag({"k": v["k"], "x": v["x"]} for v in pre)
    assert bag(after_m) == bag({"k": v["k"], "x": v["x"], "grp": grp(v)} for v in post)
    before_m2, after_m2 = split_at(raw[mid2], cut_m2)
    kept_pre = [v for v in pre if v["x"] != DROP_X]
    kept_post = [v for v in post if v["x"] != DROP_X]
    assert bag(before_m2) == bag({"k": v["k"], "x": v["x"]} for v in kept_pre)
    assert bag(after_m2) == bag({"k": v["k"], "x": v["x"], "grp": grp(v)} for v in kept_post)

    # C, the oracle: the old plan per key before the cut; the new plan per group over all
    # input, written from the cut on (the history reached it through the side topics only)
    old_pre: dict = {}
    for v in kept_pre:
        old_pre[v["k"]] = old_pre.get(v["k"], 0) + v["x"]
    new_pre: dict = {}
    new_all: dict = {}
    for rows, acc in ((kept_pre, new_pre), (kept_pre + kept_post, new_all)):
        for v in rows:
            s, n = acc.get(grp(v), (0, 0))
            acc[grp(v)] = (s + v["x"], n + 1)
    assert not set(new_all) & set(KEYS)  # the old keys and the new groups are apart
    rows = sorted(raw[out], key=lambda r: (r.partition, r.offset))
    old = [r for r in rows if r.value is not None and "n" not in r.json()]
    new = [r for r in rows if r.value is not None and "n" in r.json()]
    tombs = [r for r in rows if r.value is None]
    assert {r.key_json()["g"] for r in old} == set(KEYS)
    assert {r.key_json()["g"] for r in new} == set(new_all)
    assert sorted(r.key_json()["g"] for r in tombs) == sorted(KEYS)  # each deleted once
    for k in KEYS:  # the old chain over all input before the cut, and nothing after it
        last = [r.json() for r in old if r.key_json()["g"] == k][-1]
        assert last == {"g": k, "s": old_pre[k]}, (k, last)
    for p in {r.partition for r in rows}:  # the old output, then the new one
        olds = [r.offset for r in old if r.partition == p]
        news = [r.offset for r in new + tombs if r.partition == p]
        assert not olds or not news or max(olds) < min(news), p
    for g, (s, n) in new_all.items():
        mine = [r.json() for r in new if r.key_json()["g"] == g]
        assert all(v["s"] >= new_pre.get(g, (0, 0))[0] for v in mine), (g, mine)
        assert mine[-1] == {"g": g, "s": s, "n": n}, (g, mine[-1], s, n)
    view = {r.key_json()["g"]: r.json() for r in rows}  # per key its last record
    assert view == {**{k: None for k in KEYS},
                    **{g: {"g": g, "s": s, "n": n} for g, (s, n) in new_all.items()}}
    assert {x: ms[c].counts[x] for x in ("corrected", "added", "deleted", "matched")} == \
        {"corrected": 0, "added": len(new_pre), "deleted": len(KEYS), "matched": 0}
    assert not ms[a].reconciling and not ms[b].reconciling and ms[c].reconciling
    topics = AdminClient({"bootstrap.servers": kafka.bootstrap}).list_topics(timeout=10).topics
    assert not {mid + ".shadow", mid2 + ".shadow", out + ".shadow"} & set(topics)
    print(f"three-query cascade: {seconds:.0f} s, {len(inputs)} input records, "
          f"{len(new_all)} groups")


def test_a_cascade_aborted_after_its_shadows_run_leaves_the_old_chain_exact(kafka, tmp_path):
    from confluent_kafka.admin import AdminClient

    from gates.control import is_control
    from migrate import migration
    from migrate.cascade import Cascade

    t0 = time.monotonic()
    src = kafka.topic(prefix="casab-in", partitions=3)
    mid = kafka.topic(prefix="casab-mid", partitions=2)
    out = kafka.topic(prefix="casab-out", partitions=2, config={"cleanup.policy": "compact"})
    state = tmp_path / "state"
    tag = tmp_path.name[-6:].replace("-", "_")
    up, down = f"u{tag}", f"d{tag}"
    paths = write_plans(tmp_path, {
        "up_v1": up_plan(up, src, mid, False), "up_v2": up_plan(up, src, mid, True),
        "down_v1": down_plan(down, mid, out, False),
        "down_v2": down_plan(down, mid, out, True)})
    feeder, procs, store = start_old_chain(kafka, paths, ["up_v1", "down_v1"], [up, down],
                                           src, state)
    # killed when the upstream recorded its cut, before writing a control event: both
    # shadows run (the downstream one on the upstream shadow's side topic), and the
    # upstream's old query and shadow are paused at their high watermarks
    r = theseus("migrate", "start", str(paths["up_v2"]), str(paths["down_v2"]),
                "--bootstrap", kafka.bootstrap, "--state", str(state), "--timeout", "500",
                env=dict(os.environ, THESEUS_FAULT="after:cut"), timeout=700)
    assert r.returncode == -9, r.stdout + r.stderr
    m_up, m_down = migration.current(store, up), migration.current(store, down)
    assert (m_up.phase, m_down.phase) == ("cut", "cut") and not m_up.cut
    shadows = (m_up.new_instance, m_down.new_instance)
    assert all(store.status(i).get("status") == "running" for i in shadows)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    assert mid + ".shadow" in admin.list_topics(timeout=10).topics
    r = theseus("migrate", "abort", down, "--state", str(state), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    m_up, m_down = migration.current(store, up), migration.current(store, down)
    assert m_up.phase == m_down.phase == "aborted"
    assert Cascade.load(store, m_up.cascade).phase == "aborted"
    wait_for(lambda: all(store.status(i).get("status") == "stopped" for i in shadows), 60,
             "the shadows stop")
    assert (store.live_instance(up), store.live_instance(down)) == (up, down)
    assert all(store.status(q).get("status") == "running" for q in (up, down))
    topics = admin.list_topics(timeout=10).topics
    assert not {mid + ".shadow", out + ".shadow"} & set(topics)
    drain_and_stop(kafka, state, store, feeder, procs, [(up, up, src), (down, down, mid)])
    raw = {t: kafka.read_all(t) for t in (src, mid, out)}
    seconds = time.monotonic() - t0

    assert not any(is_control(r.headers) for t in raw for r in raw[t])
    inputs = [r.json() for r in raw[src]]
    assert {v["k"] for v in inputs} == set(KEYS) and len(inputs) > 2 * len(KEYS)
    # the old upstream over all input, each record once
    assert bag(r.json() for r in raw[mid]) == bag({"k": v["k"], "x": v["x"]} for v in inputs)
    # the old downstream over all of it; the shadow never wrote
    total: dict = {}
    for v in inputs:
        total[v["k"]] = total.get(v["k"], 0) + v["x"]
    assert all(r.value is not None and "ws" not in r.json() for r in raw[out])
    assert compacted(raw[out]) == {k: {"k": k, "s": total[k]} for k in KEYS}
    print(f"aborted cascade: {seconds:.0f} s, {len(inputs)} input records")
