"""A real transformWithState checkpoint: a table aggregate over a changelog (issue 18's
``transformWithStateInPandas`` operators) run on Kafka and Spark, then read by
``compat.checkpoint`` (operator metadata v2, state schema v3) and checked with
``theseus check --checkpoint``; the predictions are compared with what Spark really does
when the plans restart on copies of the checkpoint.

Input A makes the checkpoint; input B (updates in every region, one delete) arrives before
the restarts, so every group is written again after a restart.  The oracle is the new plan
computed in Python over the final table (A then B, the last value per key): each group a
restart writes must hold the oracle's value.
"""
from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from compat.check import load_plan

pytestmark = pytest.mark.integration

REGIONS = ["north", "south", "east"]


def _users_a() -> list[tuple[str, dict | None]]:
    return [(f"u{i}", {"user_id": f"u{i}", "region": REGIONS[i % 3], "score": 10 + i})
            for i in range(12)]


def _users_b() -> list[tuple[str, dict | None]]:
    # u0..u5 change score (u3 also region), u6 is deleted, u12 is new
    out: list[tuple[str, dict | None]] = [
        (f"u{i}", {"user_id": f"u{i}", "region": REGIONS[(i + (i == 3)) % 3],
                   "score": 100 + i}) for i in range(6)]
    out += [("u6", None), ("u12", {"user_id": "u12", "region": "east", "score": 7})]
    return out


def _plan(topic: str, out: str, group=("region", "region"),
          aggs=(("n", "count", ["*"]), ("total", "sum", ["score"]))) -> dict:
    return {"format": "theseus.plan/1", "query": "tws", "config": {"state_partitions": 2},
            "nodes": [
                {"id": "users", "step": "source", "version": 2, "topic": topic,
                 "partitions": 3, "format": "json", "role": "table", "read": "changelog",
                 "schema": [{"name": "user_id", "type": "string"},
                            {"name": "region", "type": "string"},
                            {"name": "score", "type": "bigint"}],
                 "key_columns": ["user_id"]},
                {"id": "a", "step": "aggregate", "version": 1, "inputs": ["users"],
                 "group_by": [{"name": group[0], "expr": group[1]}],
                 "aggregates": [{"name": n, "function": f, "args": a} for n, f, a in aggs]},
                {"id": "out", "step": "sink", "version": 1, "inputs": ["a"], "topic": out,
                 "format": "json", "key_columns": [group[0]], "mode": "update",
                 "delivery": "exactly_once"}]}


def _produce(kafka, topic, changes) -> None:
    kafka.produce(topic, [v for _, v in changes],
                  keys=[json.dumps({"user_id": k}, separators=(",", ":")) for k, _ in changes])


def _table(*rounds) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for changes in rounds:
        for k, v in changes:
            if v is None:
                out.pop(k, None)
            else:
                out[k] = v
    return out


def _oracle(table: dict[str, dict], key_fn) -> dict:
    groups: dict = {}
    for u in table.values():
        g = groups.setdefault(key_fn(u), {"n": 0, "total": 0})
        g["n"] += 1
        g["total"] += u["score"]
    return groups


def _run(spark, kafka, plan_path: Path, ck: Path) -> str | None:
    """availableNow on ``ck``; None when it finished, else Spark's error text."""
    from migrate.build import Builder, BuildOptions

    p = load_plan(str(plan_path))
    spark.conf.set("spark.sql.shuffle.partitions", str(p.state_partitions))
    try:
        q = Builder(spark, p, BuildOptions(bootstrap=kafka.bootstrap, available_now=True,
                                           checkpoint=str(ck),
                                           query=f"tws-{ck.parent.name}")).start()
        q.awaitTermination(180)
    except Exception as e:  # noqa: BLE001 - an error at start is an outcome here
        return str(e)
    if q.isActive:
        q.stop()
        return "did not finish within 180 s"
    exc = q.exception()
    return None if exc is None else str(exc)


@pytest.fixture(scope="module")
def tws(kafka, spark, tmp_path_factory):
    """The old plan's checkpoint over input A; input B produced after it."""
    tmp = tmp_path_factory.mktemp("tws")
    topic = kafka.topic("tws-users", partitions=3)
    _produce(kafka, topic, _users_a())
    old = _plan(topic, kafka.topic("tws-out", partitions=2))
    (tmp / "old").mkdir()
    (tmp / "old" / "plan.json").write_text(json.dumps(old))
    err = _run(spark, kafka, tmp / "old" / "plan.json", tmp / "old" / "ck")
    assert err is None, err[:3000]
    _produce(kafka, topic, _users_b())
    return {"tmp": tmp, "topic": topic, "old": old, "ck": tmp / "old" / "ck"}


def _restart(spark, kafka, tws, name: str, new: dict, key_fn) -> tuple[dict, str, str | None]:
    """(check --checkpoint's report JSON, what Spark did, its error) for ``new``."""
    from click.testing import CliRunner

    import migrate.run
    from compat.serde import dumps
    from migrate.ckcheck import check_checkpoint
    from migrate.cli import main
    from migrate.store import open_store

    d = tws["tmp"] / name
    shutil.copytree(tws["ck"], d / "ck")
    out = kafka.topic(f"tws-{name}", partitions=2)
    new = copy.deepcopy(new)
    new["nodes"][-1]["topic"] = out
    (d / "new.json").write_text(json.dumps(new))
    saved = migrate.run._SESSION
    migrate.run._SESSION = spark  # the test's one session, not a second
    try:
        r = CliRunner().invoke(main, ["check", "--checkpoint", str(d / "ck"),
                                      str(d / "new.json"), "--format", "json"])
    finally:
        migrate.run._SESSION = saved
    assert r.exit_code in (0, 1), r.output
    report = json.loads(r.stdout)
    # and with the store's recorded plan (check --query NAME --state STORE NEW)
    store = open_store(str(d / "store"))
    rec = copy.deepcopy(tws["old"])
    rec["nodes"][-1]["topic"] = out  # the sink is not what changes here
    (d / "recorded.json").write_text(json.dumps(rec))
    store.put_plan("tws", dumps(load_plan(str(d / "recorded.json"))))
    store.set_status("tws", checkpoint=str(d / "ck"), status="stopped")
    recorded = check_checkpoint(None, str(d / "new.json"), query="tws",
                                state=str(d / "store"), spark=spark)
    report["with_recorded_plan"] = recorded.checkpoint["restart"]
    err = _run(spark, kafka, d / "new.json", d / "ck")
    if err is not None:
        return report, "fails", err
    want = _oracle(_table(_users_a(), _users_b()), key_fn)
    got: dict = {}
    for rec in kafka.read_all(out):
        k = rec.key_json()[new["nodes"][-1]["key_columns"][0]]
        if rec.value is None:
            got.pop(k, None)
        else:
            got[k] = {c: rec.json()[c] for c in ("n", "total")}
    assert got, f"{name}: the restart wrote nothing"
    # every group is touched by B, so a right restart writes every group, right
    return report, ("starts" if got == want else "wrong_state"), None


def test_transform_with_state_checkpoint_is_read(tws, spark):
    """The reader on the real files: the operators and their stores are what the plan
    implies (the aggregate, then the changelog's normalisation, each a transformWithState
    operator with one value state of JSON text, keyed by the JSON of its key)."""
    from compat.checkpoint import read_checkpoint
    from compat.checkpoint_check import stateful_nodes
    from migrate.build.changelog import KEY

    p = load_plan(str(tws["tmp"] / "old" / "plan.json"))
    ck = read_checkpoint(tws["ck"])
    assert ck.last_committed is not None
    assert ck.shuffle_partitions == p.state_partitions
    assert list(ck.source_offsets()) == [tws["topic"]]
    ops = ck.operators
    assert [op.id for op in ops] == list(range(len(stateful_nodes(p)))) == [0, 1]
    for op in ops:
        assert op.metadata_version == 2, op
        assert "transformwithstate" in op.name.lower(), op
        assert op.partitions == p.state_partitions, op
        (store,) = [s for s in op.stores if not s.name.startswith("$")]
        assert store.name == "s", op  # the value state changelog._stateful declares
        assert store.key_schema is not None and store.value_schema is not None, op
        assert KEY in json.dumps(store.key_schema), store.key_schema
        assert all(f["type"] == "string" for f in store.key_schema["fields"]), store
    # the aggregate's state value is one JSON text ("st"), the normalisation's the row
    values = [[f["name"] for f in op.stores[0].value_schema["fields"]] for op in ops]
    assert values == [["st"], ["row"]], values
    print("\n" + json.dumps([op.to_json() for op in ops], indent=1))


def test_check_predicts_restart_of_same_and_key_changed_plan(tws, spark, kafka):
    same, did, err = _restart(spark, kafka, tws, "same", tws["old"], lambda u: u["region"])
    assert same["checkpoint"]["restart"]["outcome"] == "starts", same["checkpoint"]
    assert (did, err) == ("starts", None)
    # the dry run derives the same operators as the checkpoint holds
    assert [m["new"] for m in same["checkpoint"]["matched"]] == \
        [m["checkpoint"] for m in same["checkpoint"]["matched"]]


#: what each changed plan's restart did, and what was predicted (for the xfail below)
SEEN: dict[str, dict] = {}


def _changed(spark, kafka, tws, name, new, key_fn) -> dict:
    report, did, err = _restart(spark, kafka, tws, name, new, key_fn)
    seen = {"spark": did, "error": (err or "")[:400],
            "checkpoint_alone": report["checkpoint"]["restart"],
            "with_recorded_plan": report["with_recorded_plan"],
            "notes": [f["message"] for f in report["findings"]
                      if f["code"] == "checkpoint-not-verified"]}
    SEEN[name] = seen
    print("\n" + json.dumps(seen, indent=1))
    return seen


def test_check_predicts_restart_of_key_changed_plan(tws, spark, kafka):
    """The group key becomes upper(region) under the same name: the state's types (JSON
    text) do not change, its keys do.  Spark starts with the old groups' state; the plan
    check (the recorded plan) says so, the checkpoint alone says it cannot tell."""
    new = _plan(tws["topic"], "-", group=("region", "upper(region)"))
    seen = _changed(spark, kafka, tws, "key", new, lambda u: u["region"].upper())
    assert seen["spark"] == "wrong_state", seen
    assert seen["with_recorded_plan"]["outcome"] == seen["spark"], seen
    assert any("transformWithState" in n for n in seen["notes"]), seen


@pytest.mark.xfail(strict=True, reason="--checkpoint alone cannot tell a changed group key "
                   "of a changelog aggregate: theseus' transformWithState operators keep "
                   "JSON text keyed by JSON text, the same schemas whatever the key; it "
                   "predicts starts (and says not verified), Spark starts with wrong state")
def test_checkpoint_alone_predicts_key_change():
    seen = SEEN.get("key")
    assert seen is not None and seen["checkpoint_alone"]["outcome"] == seen["spark"], seen
