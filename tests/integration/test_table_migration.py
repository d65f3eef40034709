"""A live migration of a table query, with real Kafka and real Spark, judged by an oracle.

The input is a compacted table ``users`` (key ``user_id``) read as a changelog (source
version 2); the old plan counts and sums the scores per team, the new one adds ``max`` and
keeps only scores above 5 (an aggregate added: a shadow migration, which reconciles the keyed
``update`` output at the cut).  Upserts and deletes arrive before the old query starts, all
along the migration, and after it.  The teams are laid out so that each way a key can go
wrong at the cut is exercised:

* ``t0``–``t9`` hold the *live* users, the only ones changed while the queries run: their
  groups change before and after the cut C (the shadow's own rows);
* ``t10``–``t37`` change only before the old query starts: no input after C, so only the
  reconciliation can give them the new column (a stale key without it);
* ``t38``'s users are all deleted after the migration: the group empties under the new
  query, which must tombstone it (a table aggregate's retraction after the cut);
* ``t39``'s scores are all 5 or less: the new plan has no such group, so the reconciliation
  must delete the old query's row (an orphan key).

After the migration, the compacted view of the output (the last record per key, a tombstone
deleting it) must equal the new plan computed here in plain Python over the final contents
of the input table (the last value per key, a tombstone deleting it), and the
reconciliation's counts must equal the old and the new plan computed over the input before C.
"""

from __future__ import annotations

import json
import os
import random
import time

import pytest

from tests.integration.test_migration import (
    Feeder,
    spawn_run,
    theseus,
    wait_caught_up,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.own_jvm]

USERS = 400
TEAMS = 40
LIVE_TEAMS = 10  # t0..t9: changed all along
EMPTIED = "t38"  # all its users deleted after the migration
ORPHAN = "t39"  # no score above 5: the new plan has no such group


def team_of(i: int) -> str:
    return f"t{i % TEAMS}"


def table_plan(query: str, src: str, out: str, new: bool) -> dict:
    aggs = [{"name": "n", "function": "count", "args": ["*"]},
            {"name": "total", "function": "sum", "args": ["score"]}]
    nodes = [{"id": "users", "step": "source", "version": 2, "topic": src, "partitions": 3,
              "format": "json", "role": "table", "key_columns": ["user_id"],
              "schema": [{"name": "user_id", "type": "string"},
                         {"name": "team", "type": "string"},
                         {"name": "score", "type": "bigint"}]}]
    agg_in = "users"
    if new:
        aggs.append({"name": "hi", "function": "max", "args": ["score"]})
        nodes.append({"id": "keep", "step": "filter", "version": 1, "inputs": ["users"],
                      "predicate": "score > 5"})
        agg_in = "keep"
    nodes += [
        {"id": "per_team", "step": "aggregate", "version": 1, "inputs": [agg_in],
         "group_by": [{"name": "team", "expr": "team"}], "aggregates": aggs},
        {"id": "out", "step": "sink", "version": 1, "inputs": ["per_team"], "topic": out,
         "format": "json", "key_columns": ["team"], "mode": "update",
         "delivery": "exactly_once"}]
    return {"format": "theseus.plan/1", "query": query, "config": {"state_partitions": 2},
            "nodes": nodes}


def user_key(i: int) -> str:
    return json.dumps({"user_id": f"u{i}"}, separators=(",", ":"))


def first_changes(rng: random.Random) -> list[tuple[int, dict | None]]:
    """Every user once, then random upserts and deletes of the users of t0..t37 (each
    staying among the teams of its kind: live users among t0..t9, the others t10..t37)."""
    out: list[tuple[int, dict | None]] = []
    for i in range(USERS):
        score = rng.randint(0, 5) if team_of(i) == ORPHAN else rng.randint(0, 100)
        out.append((i, {"user_id": f"u{i}", "team": team_of(i), "score": score}))
    for _ in range(600):
        i = rng.randrange(USERS)
        if i % TEAMS >= 38:
            continue
        if rng.random() < 0.1:
            out.append((i, None))
            continue
        lo, hi = (0, LIVE_TEAMS) if i % TEAMS < LIVE_TEAMS else (LIVE_TEAMS, 38)
        out.append((i, {"user_id": f"u{i}", "team": f"t{rng.randrange(lo, hi)}",
                        "score": rng.randint(0, 100)}))
    return out


class LiveUsers(Feeder):
    """Upserts and deletes of the live users (teams t0..t9 only), until stopped."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(bootstrap, topic)
        from confluent_kafka import Producer

        # a key's records must land in one partition, the one the first changes went to
        # (KafkaHelper.produce partitions as the Java client does): a table's order is
        # per key, and only within a partition does Kafka keep it
        self.p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                           "partitioner": "murmur2_random"})

    def run(self) -> None:
        rng = random.Random(1818)
        live = [i for i in range(USERS) if i % TEAMS < LIVE_TEAMS]
        while not self.halt.is_set():
            for _ in range(max(1, self.rate // 10)):
                i = rng.choice(live)
                v = None if rng.random() < 0.15 else json.dumps(
                    {"user_id": f"u{i}", "team": f"t{rng.randrange(LIVE_TEAMS)}",
                     "score": rng.randint(0, 100)})
                self.p.produce(self.topic, v, key=user_key(i))
                self.n += 1
            self.p.poll(0)
            time.sleep(0.1)
        self.p.flush(30)


def final_table(records) -> dict[str, dict]:
    """The table's contents after ``records`` (input records, any order): per key its
    last value, a tombstone deleting it.  A key's records are in one partition, in order."""
    table: dict[str, dict] = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        k = r.key_json()["user_id"]
        if r.value is None:
            table.pop(k, None)
        else:
            table[k] = r.json()
    return table


def old_plan(table: dict[str, dict]) -> dict[str, dict]:
    groups: dict[str, list[int]] = {}
    for u in table.values():
        groups.setdefault(u["team"], []).append(u["score"])
    return {t: {"team": t, "n": len(s), "total": sum(s)} for t, s in groups.items()}


def new_plan(table: dict[str, dict]) -> dict[str, dict]:
    groups: dict[str, list[int]] = {}
    for u in table.values():
        if u["score"] > 5:
            groups.setdefault(u["team"], []).append(u["score"])
    return {t: {"team": t, "n": len(s), "total": sum(s), "hi": max(s)}
            for t, s in groups.items()}


def compacted(records, key: str) -> dict[str, dict]:
    """What a reader of the compacted output sees: per key its last record, tombstones
    deleting it."""
    view: dict[str, dict] = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        k = r.key_json()[key]
        if r.value is None:
            view.pop(k, None)
        else:
            view[k] = r.json()
    return view


def migrate_live(kafka, tmp_path, plans, key: str, args=(), after_cut=None):
    """The old plan under ``theseus run`` over the first changes, the live users changing
    all along, ``theseus migrate start`` to the new plan, ``after_cut(src)`` once it is
    done, then drained and stopped.  Returns the input records (control records left out),
    the cut per partition, the output records, the migration and ``migrate status``."""
    from gates.control import is_control
    from gates.state import is_acked
    from migrate import migration
    from migrate.store import DirectoryStore

    src = kafka.topic(prefix="tblmig-in", partitions=3,
                      config={"cleanup.policy": "compact"})
    out = kafka.topic(prefix="tblmig-out", partitions=2,
                      config={"cleanup.policy": "compact"})
    state = tmp_path / "state"
    query = f"tm{tmp_path.name[-6:]}".replace("-", "_")
    old_p, new_p = tmp_path / "v1.json", tmp_path / "v2.json"
    old_doc, new_doc = plans(query, src, out)
    old_p.write_text(json.dumps(old_doc))
    new_p.write_text(json.dumps(new_doc))

    changes = first_changes(random.Random(18))
    kafka.produce(src, [v for _, v in changes], keys=[user_key(i) for i, _ in changes])
    feeder = LiveUsers(kafka.bootstrap, src)
    feeder.start()
    old = spawn_run(old_p, kafka.bootstrap, state)
    store = DirectoryStore(state)
    try:
        wait_for(lambda: store.status(query).get("status") == "running", 180,
                 "old query up")
        wait_for(lambda: kafka.read_all(out, timeout=30), 120, "the old query's first output")
        r = theseus("migrate", "start", str(new_p), "--bootstrap", kafka.bootstrap,
                    "--state", str(state), "--timeout", "400", *args, env=dict(os.environ),
                    timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        m = migration.current(store, query)
        assert m.phase == "done" and m.kind == "shadow" and m.reconciling, m
        status = theseus("migrate", "status", query, "--state", str(state))
        if after_cut is not None:
            after_cut(src)
        # the new query reads live input after the cut (and after_cut's)
        wait_caught_up(kafka, state, store.live_instance(query), src)
    finally:
        feeder.stop()
    inst = store.live_instance(query)
    high = {src: kafka.end_offsets(src)}
    wait_for(lambda: is_acked(state, inst, high), 180, "the new query drains the input")
    theseus("stop", query, "--state", str(state))
    wait_for(lambda: store.status(inst).get("status") == "stopped", 120, "new query stops")
    old.wait(60)
    inputs = [r for r in kafka.read_all(src) if not is_control(r.headers)]
    where: dict[str, set[int]] = {}
    for r in inputs:
        where.setdefault(r.key, set()).add(r.partition)
    assert all(len(ps) == 1 for ps in where.values()), "a key in two partitions"
    cut = {int(p): o for p, o in m.cut[src].items()}
    return inputs, cut, kafka.read_all(out), m, status


def check_counts(m, status, old: dict, new: dict) -> None:
    """The reconciliation's counts: the old plan over the input before C (what the output
    held at the hand-over) against the new plan over it (what the side topic held); every
    key the new plan keeps differs (a new column)."""
    assert {c: m.counts[c] for c in ("corrected", "added", "deleted", "matched")} == {
        "corrected": len(set(old) & set(new)), "added": len(set(new) - set(old)),
        "deleted": len(set(old) - set(new)), "matched": 0}, m.counts
    assert f"reconciliation: {len(set(old) & set(new))} corrected" in status.stdout, \
        status.stdout


@pytest.mark.parametrize("versions", ["same", "rows", "buckets"])
def test_table_aggregate_migrates_live_to_the_new_plan_over_the_final_table(kafka, tmp_path,
                                                                            versions):
    """``rows``: the new plan also moves to the step versions on PySpark's row-based
    transformWithState (source 3, aggregate 2), whose operators Spark would refuse on the
    old checkpoint: the shadow builds them afresh from the table's history.  ``buckets``:
    the old plan runs on those, the new one moves the normalisation's state to buckets of
    table keys (source 3 -> 4, four buckets), a state layout Spark would refuse too."""
    def moved(doc, versions_of):
        for n in doc["nodes"]:
            n["version"] = versions_of.get(n["step"], n["version"])
            if n["step"] == "source" and n["version"] >= 4:
                n["state_buckets"] = 4
        return doc

    def plans(query, src, out):
        old, new = table_plan(query, src, out, False), table_plan(query, src, out, True)
        if versions == "rows":
            moved(new, {"source": 3, "aggregate": 2})
        elif versions == "buckets":
            moved(old, {"source": 3, "aggregate": 2})
            moved(new, {"source": 4, "aggregate": 2})
        return old, new

    def empty_t38(src):  # after the cut: t38 empties
        emptied = [i for i in range(USERS) if team_of(i) == EMPTIED]
        kafka.produce(src, [None] * len(emptied), keys=[user_key(i) for i in emptied])

    inputs, cut, records, m, status = migrate_live(kafka, tmp_path, plans, "team",
                                                   after_cut=empty_t38)
    before = [r for r in inputs if r.offset < cut[r.partition]]
    after = [r for r in inputs if r.offset >= cut[r.partition]]
    # the set-up did what it says: t10..t37 get no input after C, t38 is emptied after it
    touched = {(r.json() or {}).get("team") for r in after} - {None}
    assert touched <= {f"t{i}" for i in range(LIVE_TEAMS)}, sorted(touched)
    assert EMPTIED in old_plan(final_table(before)), "t38 was not a group at the cut"
    assert EMPTIED not in old_plan(final_table(inputs))
    assert ORPHAN in old_plan(final_table(before)) and ORPHAN not in new_plan(
        final_table(before))

    want = new_plan(final_table(inputs))
    quiet = {f"t{i}" for i in range(LIVE_TEAMS, 38)}
    assert quiet <= set(want) and not {EMPTIED, ORPHAN} & set(want), sorted(want)
    assert compacted(records, "team") == want
    # each way a key goes wrong at the cut
    for k in (EMPTIED, ORPHAN):
        rows = [r for r in records if r.key_json()["team"] == k]
        assert rows[0].value is not None and rows[-1].value is None, (k, rows)
    for k in quiet:  # no input after C: the new column comes from one correction alone
        rows = [r for r in records if r.key_json()["team"] == k]
        new_rows = [r for r in rows if r.value is not None and "hi" in r.json()]
        assert len(new_rows) == 1, (k, [r.json() for r in rows])
        assert all(r.offset < new_rows[0].offset for r in rows if r is not new_rows[0])
    check_counts(m, status, old_plan(final_table(before)), new_plan(final_table(before)))


# -- a filter and project over the table (ksqlDB's TableFilter and TableSelect) ------------

def select_plan(query: str, src: str, out: str, new: bool) -> dict:
    cols = [{"name": c, "expr": c} for c in ("user_id", "team", "score")]
    if new:
        cols.append({"name": "grade", "expr": "CASE WHEN score > 80 THEN 'a' ELSE 'b' END"})
    doc = table_plan(query, src, out, False)
    doc["nodes"] = [doc["nodes"][0], {
        "id": "keep", "step": "filter", "version": 1, "inputs": ["users"],
        "predicate": "score > 50" if new else "score > 20"}, {
        "id": "shape", "step": "project", "version": 1, "inputs": ["keep"], "columns": cols}, {
        "id": "out", "step": "sink", "version": 1, "inputs": ["shape"], "topic": out,
        "format": "json", "key_columns": ["user_id"], "mode": "update",
        "delivery": "exactly_once"}]
    return doc


def old_select(table: dict[str, dict]) -> dict[str, dict]:
    return {k: u for k, u in table.items() if u["score"] > 20}


def new_select(table: dict[str, dict]) -> dict[str, dict]:
    return {k: {**u, "grade": "a" if u["score"] > 80 else "b"} for k, u in table.items()
            if u["score"] > 50}


def test_table_filter_and_select_migrate_live_through_a_shadow(kafka, tmp_path):
    """Passive changes over a table (a stricter filter, a new column) are ``in_place`` for
    the checker, as ksqlDB's TableFilter and TableSelect are; restarted on the checkpoint,
    the stricter filter would drop the retraction of a row the old one wrote, which would
    stay in the output for good.  ``migrate start`` (``--strategy auto``) takes a shadow and
    reconciles: the keys no input touches after the cut get the new column, the rows the
    new filter drops their tombstone, and the compacted output is the new plan over the
    final table, key by key.  The stricter filter deletes about two fifths of the output's
    keys on purpose, more than the delete guard lets through by itself: --allow-deletes."""
    from compat.check import check_plans
    from compat.serde import from_doc

    def plans(query, src, out):
        return select_plan(query, src, out, False), select_plan(query, src, out, True)

    old_doc, new_doc = plans("q", "in", "out")
    assert check_plans(from_doc(old_doc), from_doc(new_doc)).verdict == "in_place"
    inputs, cut, records, m, status = migrate_live(kafka, tmp_path, plans, "user_id",
                                                   args=("--allow-deletes",))
    assert m.guard["ratio"] > m.guard["max_ratio"] and not m.guard["refuses"], m.guard
    before = [r for r in inputs if r.offset < cut[r.partition]]
    after_keys = {r.key_json()["user_id"] for r in inputs if r.offset >= cut[r.partition]}
    want = new_select(final_table(inputs))
    assert len(want) > 100 and len(after_keys) > 20, (len(want), len(after_keys))
    assert compacted(records, "user_id") == want
    o, n = old_select(final_table(before)), new_select(final_table(before))
    dropped = set(o) - set(n) - after_keys  # kept by the old filter only, untouched after C
    assert len(dropped) > 20, len(dropped)
    for k in dropped:
        assert [r for r in records if r.key_json()["user_id"] == k][-1].value is None, k
    check_counts(m, status, o, n)
