"""Truth test of ``theseus check --query NAME --state STORE NEW``: does its prediction say
what Spark really does when the new plan restarts on the old plan's checkpoint?

For every case: the old plan runs over input A on real Kafka and Spark (availableNow) and
leaves a checkpoint, recorded in a store as ``theseus run`` records it; input B is
produced; the check predicts the restart; then the new plan really restarts on a copy of
that checkpoint, over B, into a fresh output topic.  What Spark did is one of

* ``fails`` — the restart raised, with Spark's error class;
* ``starts`` — it ran, and its output equals an oracle: the new plan computed in Python
  over all of A and B (what the new query would have written, had it always run);
* ``wrong_state`` — it ran, and the oracle disagrees.

The table (also in docs/checkpoints.md):

| case | change | Spark did |
|---|---|---|
| identical | the same plan | starts |
| passive_filter | a filter (keeping every row) added before the aggregate | starts |
| agg_function_added | count(*) beside sum(v) | fails: STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE |
| group_key_changed | group by k -> group by g (both strings) | wrong_state (verdict
  unsupported: the output's key changes too) |
| key_type_widened | by n (int) -> by bigint | fails: STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE |
| window_changed | tumbling 10 minutes -> 20 minutes | wrong_state |
| join_type_changed | stream-stream inner join -> left outer | starts (join state v2) |
| state_partitions_changed | state_partitions 2 -> 4 | starts (the checkpoint's 2 are kept: read
  back from the restarted query's offset log and state stores) |
| stateful_added_before | a deduplicate added before the aggregate | fails:
  STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA |
| dedup_keys_changed | dedup (k, v) -> (k, g) | fails: STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE |
| source_partitions_increased | topic 2 -> 3 partitions, plan says 3 | starts |
| output_key_changed | sink key [k] -> [k, total] | starts (verdict unsupported: the output's key) |
| join_column_newly_read | the output reads amount through a stream-stream join | fails:
  STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE |
| join_source_column_added_unread | a source column nothing reads | starts |
| join_filter_column_newly_output | a filter on amount above the join (Spark moves it below);
  the output starts reading amount | fails: STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE |
| dedup_column_newly_read | the output reads g through a deduplication | starts |
"""

from __future__ import annotations

import copy
import json
import shutil
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from compat.check import check_plans, load_plan
from compat.serde import dumps

from .conftest import in_groups

pytestmark = pytest.mark.integration

T0 = "2024-01-01T00:%02d:%02dZ"


def ts(minute: int, second: int = 0) -> str:
    return T0 % (minute, second)


def events_a() -> list[dict]:
    return [{"k": "abc"[i % 3], "g": "xy"[i % 2], "n": 1 + i % 3, "v": i,
             "ts": ts(i % 10, i)} for i in range(30)]


def events_b() -> list[dict]:
    # B repeats some (k, v) pairs of A (a deduplication drops them) and stays in the same
    # 20-minute window as A
    return [{"k": "abc"[i % 3], "g": "xy"[i % 2], "n": 1 + i % 3, "v": (i * 7) % 40,
             "ts": ts(5 + i % 12, i)} for i in range(30)]


EVENT_SCHEMA = [{"name": "k", "type": "string"}, {"name": "g", "type": "string"},
                {"name": "n", "type": "int"}, {"name": "v", "type": "int"},
                {"name": "ts", "type": "timestamp"}]


def source(topic: str, partitions: int = 2, nid: str = "events", watermark: bool = False,
           schema=EVENT_SCHEMA) -> dict:
    node = {"id": nid, "step": "source", "version": 1, "topic": topic,
            "partitions": partitions, "format": "json", "role": "stream", "schema": schema}
    if watermark:
        node["event_time"] = {"column": "ts", "watermark": "1 hour"}
    return node


def plan(nodes: list[dict], partitions: int = 2) -> dict:
    return {"format": "theseus.plan/1", "query": "truth",
            "config": {"state_partitions": partitions}, "nodes": nodes}


def agg(group=(("k", "k"),), aggs=(("total", "sum", ["v"]),), inp="events",
        window=None) -> dict:
    node = {"id": "agg", "step": "aggregate", "version": 1, "inputs": [inp],
            "group_by": [{"name": n, "expr": e} for n, e in group],
            "aggregates": [{"name": n, "function": f, "args": a} for n, f, a in aggs]}
    if window:
        node["window"] = {"type": "tumbling", "column": "ts", "size": window}
    return node


def sink(inp="agg", key=("k",), mode="update") -> dict:
    return {"id": "out", "step": "sink", "version": 1, "inputs": [inp], "topic": "unused",
            "format": "json", "key_columns": list(key), "mode": mode,
            "delivery": "at_least_once"}


def base(topic: str, **kw) -> dict:
    return plan([source(topic), agg(), sink()], **kw)


# -- oracles: the new plan over A and B, in Python -----------------------------------------

def sums(rows, key, field="v"):
    out: dict = defaultdict(int)
    for r in rows:
        out[key(r)] += r[field]
    return dict(out)


def window_start(t: str, minutes: int) -> str:
    m = int(t[14:16])
    return f"2024-01-01T00:{m - m % minutes:02d}:00.000000Z"


def last_per_key(records, key) -> dict:
    out = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        doc = r.json()
        if doc is not None:
            out[key(doc)] = doc
    return out


# Each oracle gets (A, B, output records) and says whether the output is the new plan's.

def oracle_sum_by(field_key: str, extra=None):
    def check(a, b, records):
        want = sums(a + b, lambda r: r[field_key])
        got = last_per_key(records, lambda d: d[field_key])
        touched = {r[field_key] for r in b}
        if set(got) != touched:
            return False
        for k, doc in got.items():
            if doc["total"] != want[k]:
                return False
            if extra and not extra(doc, a + b):
                return False
        return True
    return check


def oracle_window(minutes: int):
    def check(a, b, records):
        want = sums(a + b, lambda r: (window_start(r["ts"], minutes), r["k"]))
        got = last_per_key(records, lambda d: (d["window"]["start"], d["k"]))
        touched = {(window_start(r["ts"], minutes), r["k"]) for r in b}
        return set(got) == touched and all(doc["total"] == want[k] for k, doc in got.items())
    return check


def oracle_dedup(keys):
    def check(a, b, records):
        seen = {tuple(r[k] for k in keys) for r in a}
        want = set()
        for r in b:
            t = tuple(r[k] for k in keys)
            if t not in seen:
                seen.add(t)
                want.add(t)
        got = [tuple(r.json()[k] for k in keys) for r in records]
        return sorted(got) == sorted(want)
    return check


ORDER_SCHEMA = [{"name": "oid", "type": "string"}, {"name": "amount", "type": "int"},
                {"name": "ts", "type": "timestamp"}]
PAY_SCHEMA = [{"name": "pid", "type": "string"}, {"name": "poid", "type": "string"},
              {"name": "pts", "type": "timestamp"}]


def join_plan(orders: str, pays: str, how: str) -> dict:
    return plan([
        {**source(orders, nid="orders", schema=ORDER_SCHEMA),
         "event_time": {"column": "ts", "watermark": "1 minute"}},
        {**source(pays, nid="pays", schema=PAY_SCHEMA),
         "event_time": {"column": "pts", "watermark": "1 minute"}},
        {"id": "j", "step": "join", "version": 1, "inputs": ["orders", "pays"], "type": how,
         "left_keys": ["oid"], "right_keys": ["poid"],
         "time_bound": "pays.pts BETWEEN orders.ts AND orders.ts + INTERVAL 2 MINUTES"},
        sink("j", key=("oid",), mode="append")])


def orders_a():
    return [{"oid": f"o{i}", "amount": i, "ts": ts(i)} for i in range(6)]


def pays_a():
    # o0..o2 are paid in A; o3..o5 are not (yet)
    return [{"pid": f"p{i}", "poid": f"o{i}", "pts": ts(i, 30)} for i in range(3)]


def orders_b():
    # o9 moves the orders' watermark to 00:29, past o4's and o5's time bound
    return [{"oid": f"o{i}", "amount": i, "ts": ts(i)} for i in range(6, 9)] + \
        [{"oid": "o9", "amount": 9, "ts": ts(30)}]


def pays_b():
    # o3 paid late enough to match; o6..o8 paid; the watermark moves far past o4, o5
    return [{"pid": "p3", "poid": "o3", "pts": ts(3, 50)}] + \
        [{"pid": f"p{i}", "poid": f"o{i}", "pts": ts(i, 30)} for i in range(6, 9)] + \
        [{"pid": "late", "poid": "none", "pts": ts(59)}]


def oracle_left_join(a, b, records):
    """Rows the left outer join writes over B after restart: every pair with a side in B,
    and every order of A or B that finds no payment (emitted once the watermark passes)."""
    orders = orders_a() + orders_b()
    pays = pays_a() + pays_b()
    new_pairs = {(o["oid"], p["pid"]) for o in orders for p in pays
                 if o["oid"] == p["poid"] and (o in orders_b() or p in pays_b())}
    # unmatched orders whose time bound the watermark (min over both sources: 00:29)
    # has passed: o4 and o5, not o9
    unmatched = {(o["oid"], None) for o in orders
                 if not any(p["poid"] == o["oid"] for p in pays) and o["ts"] < ts(27)}
    got = {(r.json()["oid"], r.json()["pid"]) for r in records}
    return got == new_pairs | unmatched


#: what the output reads through the join in the pruning cases (oid twice: paired keys)
JOINED = ["oid", "pid", "ts", "pts"]
AMOUNT_FILTER = {"id": "big", "step": "filter", "version": 1, "predicate": "amount >= 0"}


def oracle_inner_join(a, b, records):
    """The inner join's rows after the restart: every pair with a side in B."""
    orders = orders_a() + orders_b()
    pays = pays_a() + pays_b()
    want = {(o["oid"], p["pid"]) for o in orders for p in pays
            if o["oid"] == p["poid"] and (o in orders_b() or p in pays_b())}
    return {(r.json()["oid"], r.json()["pid"]) for r in records} == want


def picked_join(orders: str, pays: str, columns, schema=ORDER_SCHEMA,
                above: dict | None = None) -> dict:
    """``join_plan``'s inner join, then a projection of ``columns`` (what the output reads
    through the join: Spark prunes the rest before the join keeps its rows in state);
    ``above``, a step between the join and the projection."""
    p = join_plan(orders, pays, "inner")
    p["nodes"][0]["schema"] = schema
    top = "j"
    if above is not None:
        p["nodes"].insert(3, {**above, "inputs": ["j"]})
        top = above["id"]
    p["nodes"].insert(len(p["nodes"]) - 1, {
        "id": "pick", "step": "project", "version": 1, "inputs": [top],
        "columns": [{"name": c, "expr": c} for c in columns]})
    p["nodes"][-1]["inputs"] = ["pick"]
    return p


def oracle_dedup_project(keys):
    check = oracle_dedup(keys)

    def run(a, b, records):
        return check(a, b, records) and all("g" in r.json() for r in records)
    return run


# -- the cases ------------------------------------------------------------------------------

def _filter_before(p: dict) -> dict:
    p = copy.deepcopy(p)
    p["nodes"].insert(1, {"id": "valid", "step": "filter", "version": 1,
                          "inputs": ["events"], "predicate": "v >= 0"})
    p["nodes"][2]["inputs"] = ["valid"]
    return p


def _dedup_before(p: dict) -> dict:
    p = copy.deepcopy(p)
    p["nodes"].insert(1, {"id": "d", "step": "deduplicate", "version": 1,
                          "inputs": ["events"], "keys": ["k", "v", "ts"]})
    p["nodes"][2]["inputs"] = ["d"]
    return p


def dedup_plan(topic: str, keys) -> dict:
    return plan([source(topic), {"id": "d", "step": "deduplicate", "version": 1,
                                 "inputs": ["events"], "keys": list(keys)},
                 sink("d", mode="append")])


def _case(name, old, new, spark_did, error_class=None, oracle=None, topic="events",
          verdicts=None, after=None, plan_verdict=None):
    """``verdicts``: what the check against the checkpoint may say; ``plan_verdict``: what
    the plan check alone (old plan against new, no checkpoint) must say, where it can tell."""
    return {"name": name, "old": old, "new": new, "outcome": spark_did,
            "error_class": error_class, "oracle": oracle, "topic": topic,
            "verdicts": verdicts, "after": after, "plan_verdict": plan_verdict}


def kept_partitions(n: int):
    """After the restart: the restarted query's own offset log (its last committed batch,
    one past the old plan's) still pins ``n`` shuffle partitions, and every state store
    still has ``n`` partitions, whatever the new plan asked for."""
    def check(old_ck: Path, restarted_ck: Path) -> str | None:
        from compat.checkpoint import read_checkpoint

        before, after = read_checkpoint(old_ck), read_checkpoint(restarted_ck)
        if after.last_committed is None or after.last_committed <= before.last_committed:
            return f"no batch committed after the restart ({after.last_committed})"
        if after.shuffle_partitions != n:
            return f"the restarted query pinned {after.shuffle_partitions} partitions"
        parts = {op.partitions for op in after.operators}
        if parts != {n}:
            return f"the restarted query's state stores have {parts} partitions"
        return None
    return check


def cases(t: dict) -> list[dict]:
    ev = t["events"]
    b = base(ev)
    return [
        _case("identical", b, b, "starts", oracle=oracle_sum_by("k"),
              verdicts={"identical"}),
        _case("passive_filter", b, _filter_before(b), "starts", oracle=oracle_sum_by("k"),
              verdicts={"in_place"}),
        _case("agg_function_added", b,
              plan([source(ev), agg(aggs=(("total", "sum", ["v"]), ("c", "count", ["*"]))),
                    sink()]), "fails", "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE",
              verdicts={"migrate"}),
        _case("group_key_changed", b,
              plan([source(ev), agg(group=(("g", "g"),)), sink(key=("g",))]),
              "wrong_state", oracle=oracle_sum_by("g"), verdicts={"unsupported"}),
        _case("key_type_widened", plan([source(ev), agg(group=(("n", "n"),)),
                                        sink(key=("n",))]),
              plan([source(ev), agg(group=(("n", "CAST(n AS BIGINT)"),)), sink(key=("n",))]),
              "fails", "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE", verdicts={"migrate"}),
        _case("window_changed",
              plan([source(ev, watermark=True), agg(window="10 minutes"), sink()]),
              plan([source(ev, watermark=True), agg(window="20 minutes"), sink()]),
              "wrong_state", oracle=oracle_window(20), verdicts={"migrate"}),
        # inner join state (format 2) keeps a matched flag per row: the left outer join
        # emits o4 and o5 unmatched after the restart as if it had always run
        _case("join_type_changed", join_plan(t["orders"], t["pays"], "inner"),
              join_plan(t["orders"], t["pays"], "left"), "starts", oracle=oracle_left_join,
              topic="join", verdicts={"in_place"}),
        _case("state_partitions_changed", b, base(ev, partitions=4), "starts",
              oracle=oracle_sum_by("k"), verdicts={"migrate"}, after=kept_partitions(2),
              plan_verdict="migrate"),
        _case("stateful_added_before", b, _dedup_before(b), "fails",
              "STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA",
              verdicts={"migrate"}),
        _case("dedup_keys_changed", dedup_plan(ev, ["k", "v"]), dedup_plan(ev, ["k", "g"]),
              "fails", "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE", verdicts={"migrate"}),
        _case("source_partitions_increased", base(t["grow"]),
              plan([source(t["grow"], partitions=3), agg(), sink()]), "starts",
              oracle=oracle_sum_by("k"), topic="grow", verdicts={"in_place"}),
        _case("output_key_changed", b, plan([source(ev), agg(), sink(key=("k", "total"))]),
              "starts", oracle=oracle_sum_by("k"), verdicts={"unsupported"}),
        # State as Spark keeps it: the optimizer prunes what nothing above reads before the
        # join keeps its rows, so reading a column through the join changes the state.
        _case("join_column_newly_read", picked_join(t["orders"], t["pays"], JOINED),
              picked_join(t["orders"], t["pays"], JOINED + ["amount"]), "fails",
              "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE", topic="join", verdicts={"migrate"},
              plan_verdict="migrate"),
        _case("join_source_column_added_unread",
              picked_join(t["orders"], t["pays"], JOINED),
              picked_join(t["orders"], t["pays"], JOINED,
                          schema=ORDER_SCHEMA + [{"name": "note", "type": "string"}]),
              "starts", oracle=oracle_inner_join, topic="join", verdicts={"in_place"},
              plan_verdict="in_place"),
        # A filter above the join on one side's column: Spark pushes it below the join, so
        # the column it reads is not kept in state; output reading it then is a change.
        _case("join_filter_column_newly_output",
              picked_join(t["orders"], t["pays"], JOINED, above=AMOUNT_FILTER),
              picked_join(t["orders"], t["pays"], JOINED + ["amount"], above=AMOUNT_FILTER),
              "fails", "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE", topic="join",
              verdicts={"migrate"}, plan_verdict="migrate"),
        # Deduplication keeps its keys in state, not the rows: a column newly read through
        # it changes nothing Spark keeps.
        _case("dedup_column_newly_read",
              plan([source(ev), {"id": "d", "step": "deduplicate", "version": 1,
                                 "inputs": ["events"], "keys": ["k", "v"]},
                    {"id": "pick", "step": "project", "version": 1, "inputs": ["d"],
                     "columns": [{"name": "k", "expr": "k"}, {"name": "v", "expr": "v"}]},
                    sink("pick", mode="append")]),
              plan([source(ev), {"id": "d", "step": "deduplicate", "version": 1,
                                 "inputs": ["events"], "keys": ["k", "v"]},
                    {"id": "pick", "step": "project", "version": 1, "inputs": ["d"],
                     "columns": [{"name": "k", "expr": "k"}, {"name": "v", "expr": "v"},
                                 {"name": "g", "expr": "g"}]},
                    sink("pick", mode="append")]),
              "starts", oracle=oracle_dedup_project(["k", "v"]), verdicts={"in_place"},
              plan_verdict="in_place"),
    ]


# -- running ---------------------------------------------------------------------------------

def _start(spark, kafka, plan_path: Path, checkpoint: Path, output: str) -> Any:
    """Start a plan availableNow: the running query, or Spark's error text when it could
    not start."""
    from migrate.prove import start_available_now

    return start_available_now(spark, load_plan(str(plan_path)), kafka.bootstrap, checkpoint,
                               output, f"truth-{output}")


def _outcome(q: Any) -> str | None:
    """None when the query ``_start`` gave finished, else Spark's error text."""
    from migrate.prove import await_outcome

    return await_outcome(q)


def _wait_partitions(kafka, topic: str, n: int, timeout: float = 30.0) -> None:
    """Until the broker's metadata gives ``topic`` ``n`` partitions, each with a leader (every
    client made after that, producer or Spark source, sees them)."""
    deadline = time.monotonic() + timeout
    while True:
        md = kafka.admin.list_topics(topic, timeout=timeout).topics[topic]
        if len(md.partitions) == n and all(p.leader >= 0 for p in md.partitions.values()):
            return
        assert time.monotonic() < deadline, f"{topic}: {len(md.partitions)} partitions, not {n}"
        time.sleep(0.1)


def _error_class(text: str) -> str:
    from migrate.prove import error_class

    return error_class(text)


RESULTS: list[dict] = []


def test_checkpoint_check_predicts_spark(spark, kafka, tmp_path):
    from migrate.ckcheck import check_checkpoint
    from migrate.store import open_store

    started = time.monotonic()
    topics = {"events": kafka.topic("ev", 2), "grow": kafka.topic("grow", 2),
              "orders": kafka.topic("ord", 2), "pays": kafka.topic("pay", 2)}
    a, b = events_a(), events_b()
    kafka.produce(topics["events"], a)
    kafka.produce(topics["grow"], a)
    kafka.produce(topics["orders"], orders_a())
    kafka.produce(topics["pays"], pays_a())
    all_cases = cases(topics)
    # 1. One checkpoint per distinct old plan, over A.
    #    They share nothing but the input: they run side by side, a few at a time.
    made: dict[str, Path] = {}
    olds: list[tuple[str, str]] = []
    for c in all_cases:
        key = json.dumps(c["old"], sort_keys=True)
        if key in made:
            continue
        made[key] = tmp_path / f"old{len(made)}"
        made[key].mkdir()
        (made[key] / "plan.json").write_text(json.dumps(c["old"]))
        olds.append((c["name"], key))
    for group in in_groups(olds):
        started_olds = [(name, _start(spark, kafka, made[key] / "plan.json", made[key] / "ck",
                                      kafka.topic("out", 2))) for name, key in group]
        for name, q in started_olds:
            err = _outcome(q)
            assert err is None, f"{name}: the old plan failed: {err[:2000]}"
    # 2. Input B (and the grown topic).
    kafka.produce(topics["events"], b)
    from confluent_kafka.admin import NewPartitions

    kafka.admin.create_partitions([NewPartitions(topics["grow"], 3)])[topics["grow"]] \
        .result(30)
    _wait_partitions(kafka, topics["grow"], 3)
    kafka.produce(topics["grow"], b, partition=lambda i: i % 3)
    kafka.produce(topics["orders"], orders_b())
    kafka.produce(topics["pays"], pays_b())

    def predict_and_start(c: dict) -> tuple:
        old_dir = made[json.dumps(c["old"], sort_keys=True)]
        case_dir = tmp_path / c["name"]
        shutil.copytree(old_dir / "ck", case_dir / "ck")
        # the store, as theseus run leaves it
        store = open_store(str(case_dir / "store"))
        store.put_plan("truth", dumps(load_plan(str(old_dir / "plan.json"))))
        store.set_status("truth", checkpoint=str(case_dir / "ck"), status="stopped")
        new_path = case_dir / "new.json"
        new_path.write_text(json.dumps(c["new"]))
        # 3. The prediction.
        report = check_checkpoint(None, str(new_path), query="truth",
                                  state=str(case_dir / "store"), spark=spark)
        # 4. What Spark does: every restart is on its own copy of the checkpoint, into its
        #    own topic, so a few run side by side while the next cases are predicted.
        out = kafka.topic("out", 2)
        return (c, old_dir, case_dir, new_path, report, out,
                _start(spark, kafka, new_path, case_dir / "ck", out))

    for group in in_groups(all_cases):
        for c, old_dir, case_dir, new_path, report, out, q in \
                [predict_and_start(c) for c in group]:
            restart = report.checkpoint["restart"]
            err = _outcome(q)
            if err is not None:
                did, cls = "fails", _error_class(err)
            else:
                ok = c["oracle"](a if c["topic"] != "join" else orders_a(),
                                 b if c["topic"] != "join" else orders_b(),
                                 kafka.read_all(out))
                did, cls = ("starts" if ok else "wrong_state"), None
            after = c["after"](old_dir / "ck", case_dir / "ck") if c["after"] else None
            plan_only = check_plans(load_plan(str(old_dir / "plan.json")),
                                    load_plan(str(new_path))).verdict
            RESULTS.append({"case": c["name"], "predicted": restart["outcome"],
                            "predicted_error": restart["error_class"], "spark": did,
                            "error": cls, "verdict": report.verdict, "after": after,
                            "plan_verdict": plan_only})
    table = "\n".join(f"{r['case']:28} predicted {r['predicted']:11} "
                      f"{r['predicted_error'] or '':55} spark {r['spark']:11} "
                      f"{r['error'] or '':55} verdict {r['verdict']:11} plan {r['plan_verdict']}"
                      for r in RESULTS)
    print(f"\n{table}\n({time.monotonic() - started:.0f} s)")
    for c, r in zip(all_cases, RESULTS):
        # the case's expectation is what Spark did (measured, then fixed here)
        assert r["spark"] == c["outcome"], f"{c['name']}: Spark did {r}\n{table}"
        if c["error_class"] is not None:
            assert r["error"] == c["error_class"], f"{c['name']}: {r}\n{table}"
        assert r["verdict"] in c["verdicts"], f"{c['name']}: {r}\n{table}"
        assert r["after"] is None, f"{c['name']}: {r['after']}\n{table}"
        if c["plan_verdict"] is not None:
            assert r["plan_verdict"] == c["plan_verdict"], f"{c['name']}: {r}\n{table}"
    wrong = [r for r in RESULTS if r["predicted"] != r["spark"] or
             (r["spark"] == "fails" and r["predicted_error"] != r["error"])]
    assert not wrong, f"the check mispredicted:\n{table}"
    _cli_on_a_checkpoint_alone(spark, made, all_cases, tmp_path)
    _migrate_auto_consults_the_checkpoint(spark, kafka, made, all_cases, tmp_path)


def _cli_on_a_checkpoint_alone(spark, made, all_cases, tmp_path):
    """The command line, --checkpoint alone (no store), on an untouched old checkpoint:
    the JSON report is valid and says what Spark did above."""
    import jsonschema
    from click.testing import CliRunner

    import migrate.run
    from compat.schema_check import load_schema
    from migrate.cli import main

    c = next(c for c in all_cases if c["name"] == "agg_function_added")
    ck = made[json.dumps(c["old"], sort_keys=True)] / "ck"
    new = tmp_path / "agg_function_added" / "new.json"
    saved = migrate.run._SESSION
    migrate.run._SESSION = spark  # the test's one session, not a second
    try:
        r = CliRunner().invoke(main, ["check", "--checkpoint", str(ck), str(new),
                                      "--format", "json"])
    finally:
        migrate.run._SESSION = saved
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, load_schema("report.v1.json"))
    assert doc["checkpoint"]["restart"]["error_class"] == \
        "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE"
    assert doc["old"]["file"] is None and doc["old"]["checkpoint"] == str(ck)


def _migrate_auto_consults_the_checkpoint(spark, kafka, made, all_cases, tmp_path):
    """``migrate start --strategy auto``, step 1, on a drifted query: the store records
    the base plan, but the checkpoint was made by the plan grouping by ``n`` (restarted by
    hand).  The plan check says in place (a filter added); the checkpoint says Spark would
    refuse (another key type): the migrator goes through a shadow instead."""
    import migrate.run
    from migrate import runner
    from migrate.context import Context
    from migrate.record import Migration
    from migrate.store import open_store

    base_case = next(c for c in all_cases if c["name"] == "passive_filter")
    by_n = next(c for c in all_cases if c["name"] == "key_type_widened")
    d = tmp_path / "migrate_auto"
    shutil.copytree(made[json.dumps(by_n["old"], sort_keys=True)] / "ck", d / "ck")
    store = open_store(str(d / "store"))
    store.put_plan("truth", dumps(load_plan(str(made[json.dumps(base_case["old"],
                                                                sort_keys=True)]
                                                 / "plan.json"))))
    store.set_status("truth", checkpoint=str(d / "ck"), status="running")
    new_path = d / "new.json"
    new_path.write_text(json.dumps(base_case["new"]))
    m = Migration(id="m1", query="truth", new_plan=str(new_path), old_instance="truth",
                  strategy="auto", bootstrap=kafka.bootstrap)
    lines: list[str] = []
    saved = migrate.run._SESSION
    migrate.run._SESSION = spark
    try:
        runner.step(m, Context(store, lines.append, 120))  # 1. check
    finally:
        migrate.run._SESSION = saved
    assert m.verdict == "in_place"  # what the plan check alone says
    assert m.kind == "shadow", lines
    assert m.checkpoint.startswith("fails (STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE)")
    assert any("checkpoint contradicts the plan check" in ln for ln in lines)
