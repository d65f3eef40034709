"""Tables read as changelogs on real Kafka and Spark, judged by an independent computation.

Three compacted-style input topics (``users`` keyed by user_id, ``profiles`` keyed by
user_id, ``orders`` keyed by order_id with a foreign key user_id) get random upserts and
deletes over more than 1,000 keys, in two rounds with a run of each query after each (so
the second run retracts rows whose state the first left in the checkpoint).  The oracle is
plain Python over the final contents of each input table (the last value per key, a
tombstone deleting it); the query's output is read back as a compacted topic (the last
record per key, a tombstone deleting it) and must equal it.

The aggregate and the left joins run twice: on the old step versions' operators
(``transformWithStateInPandas``) and on the new ones' (source 3, aggregate 2, join 2:
PySpark's row-based ``transformWithState``, a left join's null-key rows padded by the join
operator), under the same oracle; the aggregate and the users-profiles left join a third
time with the tables' normalisation keeping its state per bucket of keys (source 4), the
join keeping its own per bucket of join keys too (join 3); and three queries compiled from
SQL (``theseus plan compile``), on the versions the compiler chooses for tables.
Some orders have a null user_id: a foreign-key left join pads them, an inner one drops
them.

All plans share one Spark session and the same input topics; each query runs with
``availableNow`` through ``Builder.start`` (the gated source and the exactly-once sink).
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compat.check import load_plan
from tests.integration.conftest import PYTHON, ROOT, in_groups, spark_env

pytestmark = pytest.mark.integration

USERS = 1200
ORDERS = 1500
REGIONS = ["north", "south", "east", "west", "rare"]
TIERS = ["gold", "silver", "bronze"]


def _source(id_, topic, schema, key):
    return {"id": id_, "step": "source", "version": 2, "topic": topic, "partitions": 3,
            "format": "json", "role": "table",
            "schema": [{"name": n, "type": t} for n, t in schema], "key_columns": key}


#: the step versions on PySpark's row-based transformWithState
ROWS = {"source": 3, "aggregate": 2, "join": 2}


def _rows(doc: dict) -> dict:
    """The same plan on the row-based operators (another query, so another checkpoint)."""
    doc = json.loads(json.dumps(doc))
    doc["query"] += "_rows"
    for n in doc["nodes"]:
        n["version"] = ROWS.get(n["step"], n["version"])
    return doc


#: the step versions with the state per bucket of keys: the normalisation's per bucket of
#: table keys, a table-table join's per bucket of join keys; few buckets, so that each
#: holds hundreds of keys and a batch changes many keys of one bucket
BUCKETS = {"source": 4, "aggregate": 2, "join": 3}
STATE_BUCKETS = 4


def _buckets(doc: dict) -> dict:
    """The same plan on the bucketed normalisation and join (another query and
    checkpoint)."""
    doc = json.loads(json.dumps(doc))
    doc["query"] += "_buckets"
    for n in doc["nodes"]:
        n["version"] = BUCKETS.get(n["step"], n["version"])
        if n["step"] in ("source", "join"):
            n["state_buckets"] = STATE_BUCKETS
    return doc


#: the sink topic's name in a compiled SQL case, replaced by the case's output topic
SQL_OUT = "tbl_sql_out"


def _sql(query: str, topics: dict, select: str) -> dict:
    """The plan ``theseus plan compile`` makes from tables declared over ``topics`` and one
    ``CREATE TABLE ... AS SELECT``: tables read as changelogs on the versions the compiler
    chooses today (source 4, aggregate 2, join 3)."""
    from compat.sql import compile_sql

    text = f"""SET spark.sql.shuffle.partitions = 2;
SET theseus.query = '{query}';
CREATE TABLE users (user_id STRING, region STRING, score BIGINT)
  USING kafka OPTIONS (topic '{topics["users"]}', role 'table', key 'user_id', partitions 3);
CREATE TABLE profiles (user_id STRING, tier STRING)
  USING kafka OPTIONS (topic '{topics["profiles"]}', role 'table', key 'user_id',
                       partitions 3);
CREATE TABLE orders (order_id STRING, user_id STRING, amount BIGINT)
  USING kafka OPTIONS (topic '{topics["orders"]}', role 'table', key 'order_id',
                       partitions 3);
CREATE TABLE out USING kafka OPTIONS (topic '{SQL_OUT}') AS {select};
"""
    doc = json.loads(json.dumps(compile_sql(text, f"{query}.sql")).replace(SQL_OUT, "{out}"))
    versions = {n["step"]: n["version"] for n in doc["nodes"]}
    assert versions["source"] == 4, versions  # what this case is here for
    return doc


def _user_of(rng: random.Random, order: str) -> str | None:
    u = f"u{rng.randrange(USERS + 50)}"
    return None if int(order[1:]) % 97 == 0 else u  # a few orders name no user


def _plan(query, topics, nodes, sink_input, key, out_topic):
    srcs = {
        "users": _source("users", topics["users"], [("user_id", "string"),
                                                    ("region", "string"),
                                                    ("score", "bigint")], ["user_id"]),
        "profiles": _source("profiles", topics["profiles"], [("user_id", "string"),
                                                             ("tier", "string")],
                            ["user_id"]),
        "orders": _source("orders", topics["orders"], [("order_id", "string"),
                                                       ("user_id", "string"),
                                                       ("amount", "bigint")], ["order_id"]),
    }
    used = {i for n in nodes for i in n["inputs"]} | {sink_input}
    doc = {"format": "theseus.plan/1", "query": query, "config": {"state_partitions": 2},
           "nodes": [s for k, s in srcs.items() if k in used] + nodes + [
               {"id": "out", "step": "sink", "version": 1, "inputs": [sink_input],
                "topic": out_topic, "format": "json", "key_columns": key, "mode": "update",
                "delivery": "exactly_once"}]}
    return doc


def _history(rng: random.Random, first: bool):
    """One round of random changes of the three tables: (topic name, key, value) lists."""
    users, profiles, orders = [], [], []
    if first:
        for i in range(USERS):
            u = f"u{i}"
            region = "rare" if i < 15 else rng.choice(REGIONS[:4])
            users.append((u, {"user_id": u, "region": region, "score": rng.randint(0, 100)}))
            if rng.random() < 0.7:
                profiles.append((u, {"user_id": u, "tier": rng.choice(TIERS)}))
        for i in range(ORDERS):
            o = f"o{i}"
            orders.append((o, {"order_id": o, "user_id": _user_of(rng, o),
                               "amount": rng.randint(1, 500)}))
    for _ in range(2500):
        i = rng.randrange(USERS)
        u = f"u{i}"
        if i < 15:
            if not first:
                users.append((u, None))  # the rare region empties: its group is deleted
            continue
        r = rng.random()
        if r < 0.15:
            users.append((u, None))
        elif r < 0.9:
            users.append((u, {"user_id": u, "region": rng.choice(REGIONS[:4]),
                              "score": rng.randint(0, 100)}))
        else:
            profiles.append((u, None if rng.random() < 0.5 else
                             {"user_id": u, "tier": rng.choice(TIERS)}))
    if not first:
        # every user of the rare region is deleted by the end of the second round: the
        # group, written after the first, empties and is tombstoned after the second
        users += [(f"u{i}", None) for i in range(15)]
    for _ in range(1500):
        o = f"o{rng.randrange(ORDERS)}"
        if rng.random() < 0.2:
            orders.append((o, None))
        else:
            orders.append((o, {"order_id": o, "user_id": _user_of(rng, o),
                               "amount": rng.randint(1, 500)}))
    return {"users": users, "profiles": profiles, "orders": orders}


class Tables:
    """The input topics and what the oracle knows of them: the final value per key."""

    def __init__(self, kafka):
        self.kafka = kafka
        self.topics = {t: kafka.topic(f"tbl-{t}", partitions=3)
                       for t in ("users", "profiles", "orders")}
        self.state: dict[str, dict[str, dict]] = {t: {} for t in self.topics}
        self.rng = random.Random(18)
        self.rounds = 0

    def round(self) -> None:
        for t, changes in _history(self.rng, self.rounds == 0).items():
            keys = [json.dumps({("order_id" if t == "orders" else "user_id"): k},
                               separators=(",", ":")) for k, _ in changes]
            self.kafka.produce(self.topics[t], [v for _, v in changes], keys=keys)
            for k, v in changes:
                if v is None:
                    self.state[t].pop(k, None)
                else:
                    self.state[t][k] = v
        self.rounds += 1


@pytest.fixture(scope="module")
def tables(kafka):
    t = Tables(kafka)
    t.round()
    return t


def _compacted(kafka, topic) -> dict[tuple, dict]:
    out: dict[tuple, dict] = {}
    for r in kafka.read_all(topic):
        k = tuple(sorted(r.key_json().items()))
        if r.value is None:
            out.pop(k, None)
        else:
            out[k] = r.json()
    return out


def _keyed(rows, key) -> dict[tuple, dict]:
    return {tuple(sorted((k, r[k]) for k in key)): r for r in rows}


# -- the oracle: plain Python over the final tables ---------------------------------------

def o_filter(s):
    return [u for u in s["users"].values() if u["score"] > 40]


def o_project(s):
    return [{"user_id": u["user_id"], "loud": u["region"].upper(), "double": u["score"] * 2}
            for u in o_filter(s)]


def o_aggregate(s):
    groups: dict[str, list[int]] = {}
    for u in s["users"].values():
        groups.setdefault(u["region"], []).append(u["score"])
    return [{"region": g, "n": len(v), "total": sum(v), "mean": sum(v) / len(v),
             "lo": min(v), "hi": max(v)} for g, v in groups.items()]


def o_join(s, how):
    out = []
    for u in s["users"].values():
        p = s["profiles"].get(u["user_id"])
        if p is None and how == "inner":
            continue
        out.append({**u, "tier": p["tier"] if p else None})
    return out


def o_fk_join(s, how="inner"):
    out = []
    for o in s["orders"].values():
        u = s["users"].get(o["user_id"])
        if u is not None:
            out.append({**o, "region": u["region"], "score": u["score"]})
        elif how == "left":  # an order of a missing user, padded with nulls
            out.append({**o, "region": None, "score": None})
    return out


def _cases(topics):
    flt = {"id": "f", "step": "filter", "version": 1, "inputs": ["users"],
           "predicate": "score > 40"}

    def fk(query, how):
        # orders JOIN users ON orders.user_id = users.user_id: the right key is the users
        # table's key, a column of the order (ksqlDB's foreign-key join, inner or left)
        return _plan(query, topics, [{
            "id": "uj", "step": "project", "version": 1, "inputs": ["users"],
            "columns": [{"name": "uid", "expr": "user_id"}, {"name": "region", "expr": "region"},
                        {"name": "score", "expr": "score"}]}, {
            "id": "j", "step": "join", "version": 1, "inputs": ["orders", "uj"],
            "type": how, "left_keys": ["user_id"], "right_keys": ["uid"]}, {
            "id": "p", "step": "project", "version": 1, "inputs": ["j"],
            "columns": [{"name": c, "expr": c} for c in
                        ("order_id", "user_id", "amount", "region", "score")]}],
            "p", ["order_id"], "{out}")

    cases = {
        "filter": (_plan("t_filter", topics, [flt], "f", ["user_id"], "{out}"),
                   ["user_id"], o_filter),
        "project": (_plan("t_project", topics, [flt, {
            "id": "p", "step": "project", "version": 1, "inputs": ["f"],
            "columns": [{"name": "user_id", "expr": "user_id"},
                        {"name": "loud", "expr": "upper(region)"},
                        {"name": "double", "expr": "score * 2"}]}], "p", ["user_id"],
                          "{out}"), ["user_id"], o_project),
        "aggregate": (_plan("t_agg", topics, [{
            "id": "a", "step": "aggregate", "version": 1, "inputs": ["users"],
            "group_by": [{"name": "region", "expr": "region"}],
            "aggregates": [{"name": "n", "function": "count", "args": ["*"]},
                           {"name": "total", "function": "sum", "args": ["score"]},
                           {"name": "mean", "function": "avg", "args": ["score"]},
                           {"name": "lo", "function": "min", "args": ["score"]},
                           {"name": "hi", "function": "max", "args": ["score"]}]}],
            "a", ["region"], "{out}"), ["region"], o_aggregate),
        "inner_join": (_plan("t_ij", topics, [{
            "id": "j", "step": "join", "version": 1, "inputs": ["users", "profiles"],
            "type": "inner", "left_keys": ["user_id"], "right_keys": ["user_id"]}],
            "j", ["user_id"], "{out}"), ["user_id"], lambda s: o_join(s, "inner")),
        "left_join": (_plan("t_lj", topics, [{
            "id": "j", "step": "join", "version": 1, "inputs": ["users", "profiles"],
            "type": "left", "left_keys": ["user_id"], "right_keys": ["user_id"]}],
            "j", ["user_id"], "{out}"), ["user_id"], lambda s: o_join(s, "left")),
        "fk_join": (fk("t_fk", "inner"), ["order_id"], o_fk_join),
        "fk_left_join": (fk("t_fkl", "left"), ["order_id"], lambda s: o_fk_join(s, "left")),
    }
    cases["sql_aggregate"] = (_sql("t_sql_agg", topics, (
        "SELECT region, count(*) AS n, sum(score) AS total, avg(score) AS mean, "
        "min(score) AS lo, max(score) AS hi FROM users GROUP BY region")),
        ["region"], o_aggregate)
    cases["sql_left_join"] = (_sql("t_sql_lj", topics, (
        "SELECT u.user_id, u.region, u.score, p.tier "
        "FROM users u LEFT JOIN profiles p ON u.user_id = p.user_id")),
        ["user_id"], lambda s: o_join(s, "left"))
    cases["sql_fk_left_join"] = (_sql("t_sql_fkl", topics, (
        "SELECT o.order_id, o.user_id, o.amount, u.region, u.score "
        "FROM orders o LEFT JOIN users u ON o.user_id = u.user_id")),
        ["order_id"], lambda s: o_fk_join(s, "left"))
    for name in ROW_CASES:
        doc, key, fn = cases[name.removesuffix("_rows")]
        cases[name] = (_rows(doc), key, fn)
    for name in BUCKET_CASES:
        doc, key, fn = cases[name.removesuffix("_buckets")]
        cases[name] = (_buckets(doc), key, fn)
    return cases


def _load(tmp_path: Path, doc: dict, out_topic: str):
    text = json.dumps(doc).replace("{out}", out_topic)
    p = tmp_path / f"{doc['query']}.json"
    p.write_text(text)
    return load_plan(str(p)), p


def _start(spark, plan, bootstrap, checkpoint):
    from migrate.build import Builder, BuildOptions

    # a streaming query copies the session's conf when it starts: the next start may change it
    spark.conf.set("spark.sql.shuffle.partitions", str(plan.state_partitions))
    opts = BuildOptions(bootstrap=bootstrap, query=f"{plan.query}-{checkpoint.name}",
                        available_now=True, checkpoint=str(checkpoint))
    return Builder(spark, plan, opts).start()


def _finish(name: str, q, deadline: float) -> None:
    finished = q.awaitTermination(max(1.0, deadline - time.monotonic()))
    if q.isActive:
        q.stop()
    assert q.exception() is None, f"{name}: {q.exception()}"
    assert finished, f"{name}: did not finish within 300 s"


def _same(got: dict, want: dict) -> None:
    assert set(got) == set(want), (f"{len(set(got) - set(want))} keys too many, e.g. "
                                   f"{sorted(set(got) - set(want))[:3]}; "
                                   f"{len(set(want) - set(got))} missing, e.g. "
                                   f"{sorted(set(want) - set(got))[:3]}")
    bad = []
    for k, w in want.items():
        g = got[k]
        assert set(g) == set(w), f"key {k}: columns {sorted(g)}, expected {sorted(w)}"
        for c, v in w.items():
            gv = g.get(c)
            if isinstance(v, float) and gv is not None:
                if abs(gv - v) > 1e-6 * max(1.0, abs(v)):
                    bad.append((k, c, gv, v))
            elif gv != v:
                bad.append((k, c, gv, v))
    assert not bad, f"{len(bad)} wrong values, e.g. {bad[:5]}"


#: the same queries on the new step versions
ROW_CASES = ["aggregate_rows", "left_join_rows", "fk_left_join_rows"]
#: on the bucketed normalisation (source 4): the aggregate, and a left join whose both
#: sides are normalised so and which keeps its own state per bucket of join keys (join 3)
#: (they fill the last group of three side by side: cheap)
BUCKET_CASES = ["aggregate_buckets", "left_join_buckets"]
#: compiled from SQL: the versions the compiler chooses for tables (source 4, aggregate 2,
#: join 3), a foreign-key left join on join 3 among them
SQL_CASES = ["sql_aggregate", "sql_left_join", "sql_fk_left_join"]
CASES = ["filter", "project", "aggregate", "inner_join", "left_join", "fk_join",
         "fk_left_join", *ROW_CASES, *BUCKET_CASES, *SQL_CASES]


@pytest.fixture(scope="module")
def runs(tables, kafka, spark, tmp_path_factory):
    """Every case's query run after the first round of changes, then again (same
    checkpoint) after the second: what each output topic holds then, per case."""
    tmp = tmp_path_factory.mktemp("tables")
    cases = _cases(tables.topics)
    outs = {}
    for name in CASES:
        doc, _key, _fn = cases[name]
        out = kafka.topic(f"tbl-out-{name}", partitions=2)
        plan, _ = _load(tmp, doc, out)
        outs[name] = (plan, out, tmp / f"ck-{name}")
    timings = {}
    for rnd in range(2):
        if rnd:
            tables.round()
        # The queries share no checkpoint, sink topic or state: they run side by
        # side in the one session, a few at a time.
        t0 = time.monotonic()
        for group in in_groups(CASES):
            queries = {name: _start(spark, outs[name][0], kafka.bootstrap, outs[name][2])
                       for name in group}
            try:
                for name, q in queries.items():
                    _finish(name, q, time.monotonic() + 300.0)
            finally:
                for q in queries.values():
                    if q.isActive:
                        q.stop()
        timings[rnd] = round(time.monotonic() - t0, 1)
    print(f"table query run times per round of {len(CASES)} (s):", timings)
    return {name: outs[name][1] for name in CASES}


@pytest.mark.parametrize("name", CASES)
def test_table_query_equals_the_oracle_over_the_final_tables(name, runs, tables, kafka):
    _doc, key, fn = _cases(tables.topics)[name]
    want = _keyed(fn(tables.state), key)
    got = _compacted(kafka, runs[name])
    assert want, "the oracle is empty: the test would prove nothing"
    _same(got, want)


def test_the_rare_group_emptied_and_was_tombstoned(runs, tables, kafka):
    recs = [r for r in kafka.read_all(runs["aggregate"]) if r.key_json() == {"region": "rare"}]
    assert recs and recs[0].value is not None, "the rare group was never written"
    assert recs[-1].value is None, "an emptied group's key must end with a tombstone"
    assert "rare" not in {u["region"] for u in tables.state["users"].values()}


@pytest.mark.own_jvm
@pytest.mark.parametrize("case", ["aggregate", "aggregate_rows", "aggregate_buckets",
                                  "left_join_buckets"])
def test_table_query_survives_sigkill(case, kafka, tmp_path):
    """``theseus run`` of a table query over its own topics, killed with SIGKILL while
    changes still arrive, restarted on its checkpoint: the output equals the oracle (the
    exactly-once sink skips a batch Spark replays; the state resumes from the last
    committed batch).  The table aggregate on the old step versions, the row-based ones
    and the bucketed normalisation (source 4); the left join on the bucketed normalisation
    and join (join 3), both tables changing."""
    tables = ["users", "profiles"] if "join" in case else ["users"]
    topics = {t: kafka.topic(f"tbl-kill-{t}-{case}", partitions=3) if t in tables else "-"
              for t in ("users", "profiles", "orders")}
    doc, key, fn = _cases(topics)[case]
    out = kafka.topic(f"tbl-out-kill-{case}", partitions=2)
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(doc).replace("{out}", out).replace('"t_', '"t_kill_'))
    rng = random.Random(1818)
    first, second = _history(rng, True), _history(rng, False)
    # each table's changes in six chunks, sent table by table in the same order
    state: dict[str, dict[str, dict]] = {t: {} for t in tables}
    chunks = []
    for t in tables:
        changes = first[t] + second[t]
        step = len(changes) // 6 + 1
        for i, c in enumerate(changes[j:j + step] for j in range(0, len(changes), step)):
            while len(chunks) <= i:
                chunks.append([])
            chunks[i].append((t, c))

    def send(chunk):
        for t, ordered in chunk:
            kafka.produce(topics[t], [v for _, v in ordered],
                          keys=[json.dumps({"user_id": k}, separators=(",", ":"))
                                for k, _ in ordered])
            for k, v in ordered:
                if v is None:
                    state[t].pop(k, None)
                else:
                    state[t][k] = v

    cmd = [PYTHON, "-m", "migrate.cli", "run", str(plan_path), "--bootstrap", kafka.bootstrap,
           "--state", str(tmp_path / "store")]
    env = spark_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        sent = 0
        deadline = time.monotonic() + 240
        while not kafka.read_all(out, timeout=30) and time.monotonic() < deadline:
            if sent < 3:
                send(chunks[sent])
                sent += 1
            assert proc.poll() is None, "the query stopped before it was killed"
            time.sleep(1)
        assert kafka.read_all(out, timeout=30), "no output within 240 s"
        send(chunks[sent])  # arrives while the query runs: killed mid-batch or between
        sent += 1
        time.sleep(1.5)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    for c in chunks[sent:]:
        send(c)
    done = subprocess.run(cmd + ["--available-now"], env=env, cwd=ROOT, capture_output=True,
                          timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr).decode()[-3000:]
    _same(_compacted(kafka, out), _keyed(fn(state), key))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
