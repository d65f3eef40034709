"""A cascade of two queries migrated together, with real Kafka and real Spark, judged by an
oracle computed here in plain Python.

The upstream is a stateless enrichment (source -> project -> topic T); the downstream a
stateful aggregate per key reading T (T -> sum per key -> compacted, keyed update output O).
Both change: the new upstream adds a column ``w = x * 10``, the new downstream sums it too.
30 keys get input before the cut, 10 of them keep getting input during and after the
migration.  Afterwards:

- T holds, before the propagated control events, exactly the old upstream over the input
  before the upstream's cut, and after them exactly the new upstream over the input from
  that cut (every input record once);
- every row the new downstream writes has ``ws == 10 * s``: it computed the new downstream
  plan over the new upstream plan over *all* input (the history came through the upstream
  shadow's side topic, which the old T never had);
- each key's last row from the old downstream is the old chain over the input before the
  cut, and comes before the first new row;
- the compacted view of O is the new chain over all input for every key (the downstream
  reconciles: the 20 keys without input after the cut carry the new column too);
- the side topics are gone and the control records in T are tombstoned.

The same holds with the migrator SIGKILLed mid-chain (after the upstream recorded its
propagation, then after the downstream adopted the cut) and resumed through either query.
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest

from tests.integration.test_migration import spawn_run, theseus, wait_caught_up, wait_for
from tests.integration.test_reconcile import KEYS, LIVE, LiveKeys, compacted

pytestmark = [pytest.mark.integration, pytest.mark.own_jvm]


def up_plan(query: str, src: str, mid: str, new: bool,
            added: tuple[str, str] = ("w", "x * 10")) -> dict:
    """Source -> project -> topic ``mid``; the new plan adds the column ``added`` (name,
    expression)."""
    cols = [{"name": "k", "expr": "k"}, {"name": "x", "expr": "x"}]
    if new:
        cols.append({"name": added[0], "expr": added[1]})
    return {"format": "theseus.plan/1", "query": query, "config": {"state_partitions": 2},
            "nodes": [
                {"id": "events", "step": "source", "version": 1, "topic": src,
                 "partitions": 3, "format": "json", "role": "stream",
                 "schema": [{"name": "k", "type": "string"}, {"name": "x", "type": "bigint"}]},
                {"id": "enrich", "step": "project", "version": 1, "inputs": ["events"],
                 "columns": cols},
                {"id": "out", "step": "sink", "version": 1, "inputs": ["enrich"], "topic": mid,
                 "format": "json", "key_columns": ["k"], "mode": "append",
                 "delivery": "exactly_once"}]}


def down_plan(query: str, mid: str, out: str, new: bool) -> dict:
    schema = [{"name": "k", "type": "string"}, {"name": "x", "type": "bigint"}]
    aggs = [{"name": "s", "function": "sum", "args": ["x"]}]
    if new:
        schema.append({"name": "w", "type": "bigint"})
        aggs.append({"name": "ws", "function": "sum", "args": ["w"]})
    return {"format": "theseus.plan/1", "query": query, "config": {"state_partitions": 2},
            "nodes": [
                {"id": "enriched", "step": "source", "version": 1, "topic": mid,
                 "partitions": 2, "format": "json", "role": "stream", "schema": schema},
                {"id": "per_key", "step": "aggregate", "version": 1, "inputs": ["enriched"],
                 "group_by": [{"name": "k", "expr": "k"}], "aggregates": aggs},
                {"id": "out", "step": "sink", "version": 1, "inputs": ["per_key"],
                 "topic": out, "format": "json", "key_columns": ["k"], "mode": "update",
                 "delivery": "exactly_once"}]}


def run_cascade(kafka, tmp_path, faults: list[tuple[str, str]] | None = None):
    """Run the old chain, migrate it to the new one (killing the migrator after the phases
    of ``faults``, resuming through the query named with each), drain, stop; returns what
    the oracle needs."""
    from gates.state import is_acked
    from migrate import migration
    from migrate.store import DirectoryStore

    src = kafka.topic(prefix="cas-in", partitions=3)
    mid = kafka.topic(prefix="cas-mid", partitions=2)
    out = kafka.topic(prefix="cas-out", partitions=2, config={"cleanup.policy": "compact"})
    state = tmp_path / "state"
    tag = tmp_path.name[-6:].replace("-", "_")
    up, down = f"u{tag}", f"d{tag}"
    paths = {}
    for name, doc in (("up_v1", up_plan(up, src, mid, False)),
                      ("up_v2", up_plan(up, src, mid, True)),
                      ("down_v1", down_plan(down, mid, out, False)),
                      ("down_v2", down_plan(down, mid, out, True))):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(doc))
    # every key gets input before the cut (before the old chain starts) ...
    kafka.produce(src, [{"k": k, "x": i % 7 + 1} for i, k in enumerate(KEYS * 2)],
                  keys=[{"k": k} for k in KEYS * 2])
    feeder = LiveKeys(kafka.bootstrap, src)  # ... and the live ones all along
    feeder.start()
    olds = [spawn_run(paths["up_v1"], kafka.bootstrap, state),
            spawn_run(paths["down_v1"], kafka.bootstrap, state)]
    store = DirectoryStore(state)
    wait_for(lambda: all(store.status(q).get("status") == "running" for q in (up, down)),
             240, "the old chain up")
    # live input through the whole old chain before the cut
    wait_caught_up(kafka, state, store.live_instance(up), src)
    wait_caught_up(kafka, state, store.live_instance(down), mid)
    env = dict(os.environ)
    steps = list(faults or [])
    if steps:
        env["THESEUS_FAULT"] = f"after:{steps[0][0]}"
    r = theseus("migrate", "start", str(paths["up_v2"]), str(paths["down_v2"]),
                "--bootstrap", kafka.bootstrap, "--state", str(state), "--timeout", "500",
                env=env, timeout=700)
    killed = 0
    while r.returncode == -9 and steps:
        killed += 1
        _, through = steps.pop(0)
        env = dict(os.environ)
        if steps:
            env["THESEUS_FAULT"] = f"after:{steps[0][0]}"
        r = theseus("migrate", "resume", up if through == "up" else down, "--state",
                    str(state), "--timeout", "500", env=env, timeout=700)
    assert r.returncode == 0, r.stdout + r.stderr
    assert killed == len(faults or []), "a planned kill did not happen"
    m_up, m_down = migration.current(store, up), migration.current(store, down)
    assert m_up.phase == m_down.phase == "done" and m_up.cascade == m_down.cascade
    status = theseus("migrate", "status", down, "--state", str(state))
    assert status.returncode == 0, status.stderr
    # more input after the cut, then drain the chain and stop it
    a1, b1 = store.live_instance(up), store.live_instance(down)
    assert (a1, b1) == (m_up.new_instance, m_down.new_instance)
    wait_caught_up(kafka, state, a1, src)
    feeder.stop()
    wait_for(lambda: is_acked(state, a1, {src: kafka.end_offsets(src)}), 180,
             "the new upstream drains the input")
    wait_for(lambda: is_acked(state, b1, {mid: kafka.end_offsets(mid)}), 180,
             "the new downstream drains the new upstream's output")
    for q, inst in ((up, a1), (down, b1)):
        assert theseus("stop", q, "--state", str(state)).returncode == 0
        wait_for(lambda inst=inst: store.status(inst).get("status") == "stopped", 120,
                 f"{inst} stops")
    for p in olds:
        p.wait(60)
    return dict(src=kafka.read_all(src), mid=kafka.read_all(mid), out=kafka.read_all(out),
                up=m_up, down=m_down, status=status.stdout, topics=(src, mid, out))


def check_chain(kafka, res) -> None:
    from confluent_kafka.admin import AdminClient

    from gates.control import control_key, is_control

    m_up, m_down = res["up"], res["down"]
    src, mid, out = res["topics"]
    inputs = [r for r in res["src"] if not is_control(r.headers)]
    cut_s = m_up.cut[src]
    cut_t = m_up.out_cut[mid]
    assert m_down.cut == {mid: cut_t}, "the downstream's cut is the propagated one"
    pre = [r.json() for r in inputs if r.offset < cut_s[str(r.partition)]]
    post = [r.json() for r in inputs if r.offset >= cut_s[str(r.partition)]]
    assert {v["k"] for v in pre} == set(KEYS) and post and {v["k"] for v in post} == set(LIVE)

    def bag(rows):
        return Counter(json.dumps(v, sort_keys=True) for v in rows)

    # The upstream: T is the old upstream over the input before the cut, the control events,
    # then the new upstream over the input from the cut: every input record exactly once.
    data = [r for r in res["mid"] if not is_control(r.headers)]
    ctl = [r for r in res["mid"] if is_control(r.headers)]
    assert {(r.partition, r.offset) for r in ctl if r.value is not None} == \
        {(int(p), o) for p, o in cut_t.items()}
    for p, o in cut_t.items():  # tombstoned once the migration was done
        assert any(r.partition == int(p) and r.value is None and r.offset > o and
                   r.key == control_key(m_up.id) for r in ctl)
    before_t = [r.json() for r in data if r.offset < cut_t[str(r.partition)]]
    after_t = [r.json() for r in data if r.offset > cut_t[str(r.partition)]]
    assert bag(before_t) == bag({"k": v["k"], "x": v["x"]} for v in pre)
    assert bag(after_t) == bag({"k": v["k"], "x": v["x"], "w": v["x"] * 10} for v in post)

    # The downstream, in the order a reader of O sees it.
    pre_sum: dict = {}
    for v in pre:
        pre_sum[v["k"]] = pre_sum.get(v["k"], 0) + v["x"]
    total: dict = {}
    for v in pre + post:
        total[v["k"]] = total.get(v["k"], 0) + v["x"]
    rows = sorted(res["out"], key=lambda r: (r.partition, r.offset))
    for k in KEYS:
        mine = [r.json() for r in rows if r.key_json()["k"] == k]
        old = [v for v in mine if "ws" not in v]
        new = [v for v in mine if "ws" in v]
        assert old and new, (k, mine)
        # the old chain over the input before the cut, all of it, and nothing after it
        assert old[-1] == {"k": k, "s": pre_sum[k]}, (k, old[-1], pre_sum[k])
        assert mine.index(new[0]) == len(old), f"{k}: an old row after a new one: {mine}"
        # the new downstream over the new upstream over all history: w everywhere
        assert all(v["ws"] == 10 * v["s"] and v["s"] >= pre_sum[k] for v in new), (k, new)
        assert new[-1] == {"k": k, "s": total[k], "ws": 10 * total[k]}, (k, new[-1])
    view = compacted(res["out"])
    assert view == {k: {"k": k, "s": total[k], "ws": 10 * total[k]} for k in KEYS}
    # every key's row before the cut lacked the new column: all 30 corrected at the cut
    assert {x: m_down.counts[x] for x in ("corrected", "added", "deleted", "matched")} == \
        {"corrected": 30, "added": 0, "deleted": 0, "matched": 0}, m_down.counts
    assert m_up.counts == {} and not m_up.reconciling  # the upstream never reconciles
    assert f"cascade {m_up.cascade}: done" in res["status"], res["status"]
    assert "30 corrected, 0 added, 0 deleted, 0 already right" in res["status"]
    topics = AdminClient({"bootstrap.servers": kafka.bootstrap}).list_topics(timeout=10).topics
    assert mid + ".shadow" not in topics and out + ".shadow" not in topics


def test_a_two_query_cascade_switches_at_one_logical_cut(kafka, tmp_path):
    check_chain(kafka, run_cascade(kafka, tmp_path))


def test_a_cascade_survives_sigkill_of_the_migrator_mid_chain(kafka, tmp_path):
    """Killed right after the upstream recorded its propagation (before writing the control
    events into T), resumed through the upstream (its old downstream query, idle at the
    cut by then, hands over as soon as it is capped); killed again right after the
    downstream recorded its alignment (its old query capped at the propagated cut, the
    upstream's new query writing past it), resumed through the downstream."""
    check_chain(kafka, run_cascade(kafka, tmp_path,
                                   faults=[("propagate", "up"), ("align", "down")]))
