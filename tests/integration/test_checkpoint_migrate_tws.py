"""``theseus migrate start --strategy auto`` on a change the plan check calls in place and
the checkpoint contradicts, carried through to the end on real Kafka and Spark.

The query is a table aggregate over a changelog (Theseus' transformWithState operators).
``sum(score)`` becomes ``sum(score * 2)``: the plan check says in place (the state keeps
its layout; history stays computed the old way), but over a changelog the aggregate
retracts rows it added, so the old state cannot serve the new plan; its state name says so
(``compat.tws_state``), the checkpoint check predicts wrong state, and ``auto`` falls back
to a shadow migration.  The oracle: the output topic's last value per key equals the new
plan over the final table (reconciled at the cut, then kept by the new query).
"""

from __future__ import annotations

import json
import time

import pytest

from tests.integration.test_migration import spawn_run, theseus, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.own_jvm]

REGIONS = ["north", "south", "east"]


def _plan(query: str, src: str, out: str, arg: str) -> dict:
    return {"format": "theseus.plan/1", "query": query, "config": {"state_partitions": 2},
            "nodes": [
                {"id": "users", "step": "source", "version": 2, "topic": src,
                 "partitions": 3, "format": "json", "role": "table", "read": "changelog",
                 "schema": [{"name": "user_id", "type": "string"},
                            {"name": "region", "type": "string"},
                            {"name": "score", "type": "bigint"}],
                 "key_columns": ["user_id"]},
                {"id": "a", "step": "aggregate", "version": 1, "inputs": ["users"],
                 "group_by": [{"name": "region", "expr": "region"}],
                 "aggregates": [{"name": "n", "function": "count", "args": ["*"]},
                                {"name": "total", "function": "sum", "args": [arg]}]},
                {"id": "out", "step": "sink", "version": 1, "inputs": ["a"], "topic": out,
                 "format": "json", "key_columns": ["region"], "mode": "update",
                 "delivery": "exactly_once"}]}


def _produce(kafka, topic, changes) -> None:
    kafka.produce(topic, [v for _, v in changes],
                  keys=[json.dumps({"user_id": k}, separators=(",", ":")) for k, _ in changes])


def test_auto_falls_back_to_a_shadow_when_the_changelog_state_disagrees(kafka, tmp_path):
    from gates.state import is_acked
    from migrate import migration
    from migrate.store import DirectoryStore

    src = kafka.topic(prefix="ckmig-users", partitions=3)
    out = kafka.topic(prefix="ckmig-out", partitions=1)
    state = tmp_path / "state"
    query = f"c{tmp_path.name[-6:]}".replace("-", "_")
    old_p, new_p = tmp_path / "v1.json", tmp_path / "v2.json"
    old_p.write_text(json.dumps(_plan(query, src, out, "score")))
    new_p.write_text(json.dumps(_plan(query, src, out, "score * 2")))
    a = [(f"u{i}", {"user_id": f"u{i}", "region": REGIONS[i % 3], "score": 10 + i})
         for i in range(12)]
    _produce(kafka, src, a)
    r = theseus("check", str(old_p), str(new_p))
    assert r.returncode == 0 and "in_place" in r.stdout, r.stdout + r.stderr

    old = spawn_run(old_p, kafka.bootstrap, state)
    store = DirectoryStore(state)
    wait_for(lambda: store.status(query).get("status") == "running", 180, "old query up")
    wait_for(lambda: is_acked(state, query, {src: kafka.end_offsets(src)}), 180,
             "old query reads A")
    r = theseus("migrate", "start", str(new_p), "--bootstrap", kafka.bootstrap, "--state",
                str(state), "--strategy", "auto", "--timeout", "400", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    m = migration.current(store, query)
    assert m.phase == "done" and m.verdict == "in_place", m
    assert m.kind == "shadow", r.stdout
    assert m.checkpoint.startswith("wrong_state: Spark restarts, but without the state"), \
        m.checkpoint
    assert "checkpoint contradicts the plan check" in r.stdout + r.stderr

    # B after the hand-over: updates in every region, a delete, a new user
    b: list[tuple[str, dict | None]] = [
        (f"u{i}", {"user_id": f"u{i}", "region": REGIONS[(i + (i == 3)) % 3],
                   "score": 100 + i}) for i in range(6)]
    b += [("u6", None), ("u12", {"user_id": "u12", "region": "east", "score": 7})]
    _produce(kafka, src, b)
    inst = store.live_instance(query)
    assert inst == m.new_instance
    wait_for(lambda: is_acked(state, inst, {src: kafka.end_offsets(src)}), 180,
             "new query reads B")
    time.sleep(2)
    theseus("stop", query, "--state", str(state))
    wait_for(lambda: store.status(inst).get("status") == "stopped", 120, "new stops")
    old.wait(60)

    table: dict[str, dict] = {}
    for k, v in a + b:
        if v is None:
            table.pop(k, None)
        else:
            table[k] = v
    want: dict[str, dict] = {}
    for u in table.values():
        g = want.setdefault(u["region"], {"n": 0, "total": 0})
        g["n"] += 1
        g["total"] += 2 * u["score"]
    got: dict[str, dict] = {}
    for rec in sorted(kafka.read_all(out), key=lambda r: r.offset):
        k = rec.key_json()["region"]
        if rec.value is None:
            got.pop(k, None)
        else:
            got[k] = {c: rec.json()[c] for c in ("n", "total")}
    assert got == want
