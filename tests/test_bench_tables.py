"""The tables benches' knobs and bookkeeping, without Spark: which queries and parts a run
measures (a typo refused, not measured as nothing), that the cluster bench's tables part
keeps the other part's figures in cluster_speed.json, and its scaling ratio."""

from __future__ import annotations

import json

import pytest

from bench import cluster_speed, tables


def test_queries_default_to_all_and_keep_the_baseline_first():
    assert tables.selected(None) == tables.NAMES
    assert tables.selected("table_table_join.rows, table_aggregate.rows") == [
        tables.BASELINE, "table_aggregate.rows", "table_table_join.rows"]


def test_the_bucketed_join_is_a_join_query_only():
    assert tables.NAMES[-2:] == ["table_table_join.buckets", "table_table_join.join_buckets"]
    assert "table_aggregate.join_buckets" not in tables.NAMES
    assert tables.selected("table_table_join.join_buckets") == [
        tables.BASELINE, "table_table_join.join_buckets"]
    with pytest.raises(SystemExit, match="unknown table_aggregate.join_buckets"):
        tables.selected("table_aggregate.join_buckets")


def test_unknown_query_is_refused_with_the_known_ones():
    with pytest.raises(SystemExit, match="unknown table_agg.*table_aggregate.rows"):
        tables.selected("table_agg,table_aggregate.rows")


def test_parts():
    assert cluster_speed.chosen_parts("") == ["gated", "tables"]
    assert cluster_speed.chosen_parts("tables") == ["tables"]
    with pytest.raises(SystemExit, match="unknown table"):
        cluster_speed.chosen_parts("table")


def test_a_part_rewrites_only_its_keys(tmp_path):
    path = tmp_path / "cluster_speed.json"
    path.write_text(json.dumps({"rows": 200000, "runs": [{"path": "x"}],
                                "tables": {"keys": 1}}))
    cluster_speed.write_results(path, {"tables": {"keys": 50000}})
    assert json.loads(path.read_text()) == {"rows": 200000, "runs": [{"path": "x"}],
                                            "tables": {"keys": 50000},
                                            "tables_earlier": [{"keys": 1}]}
    cluster_speed.write_results(path, {"rows": 100000, "runs": []})
    assert json.loads(path.read_text()) == {"rows": 100000, "runs": [],
                                            "tables": {"keys": 50000},
                                            "tables_earlier": [{"keys": 1}]}
    cluster_speed.write_results(path, {"tables": {"keys": 20000}})
    assert json.loads(path.read_text())["tables_earlier"] == [{"keys": 1}, {"keys": 50000}]


def test_scaling_is_the_medians_ratio_per_query():
    runs = [{"query": "a", "executors": 1, "keys_per_s": k} for k in (1000, 1200, 900)]
    runs += [{"query": "a", "executors": 2, "keys_per_s": k} for k in (1800, 2000)]
    runs += [{"query": "j", "executors": 1, "keys_per_s": 500}]
    (a, j) = cluster_speed.table_scaling(runs)
    assert a["executors_1"] == {"keys_per_s_median": 1000, "keys_per_s_all": [1000, 1200, 900]}
    assert a["executors_2"]["keys_per_s_median"] == 1900
    assert a["two_over_one"] == 1.9
    assert "two_over_one" not in j  # one executor count alone: no ratio


class _Value:
    """A value state in memory, as ``migrate.build.changelog._State`` is used."""

    def __init__(self):
        self.v = None

    def value(self):
        return self.v

    def update(self, v):
        self.v = tuple(v)

    def remove(self):
        self.v = None


def test_bucketed_normalisation_emits_what_the_per_key_one_does():
    from bench import table_buckets
    from migrate.build.changelog import _normalise_group

    rng = __import__("random").Random(5)
    bucket, per_key = _Value(), {}
    offset = 0
    for _batch in range(30):
        changes = []
        for _ in range(rng.randrange(1, 12)):
            offset += 1
            k = f"k{rng.randrange(6)}"
            deleted = rng.random() < 0.25
            changes.append((k, offset, deleted, None if deleted else f'{{"v":{rng.randrange(3)}}}'))
        rng.shuffle(changes)  # a batch's rows come in any order: the offset decides
        got = table_buckets.normalise_bucket(("b0",), iter(changes), bucket)
        want = []
        for k in sorted({c[0] for c in changes}):
            want += _normalise_group((k,), [c[1:] for c in changes if c[0] == k],
                                     per_key.setdefault(k, _Value()))
        assert sorted(got) == sorted(want)
        rows = {k: s.v[0] for k, s in per_key.items() if s.v is not None}
        assert (json.loads(bucket.v[0]) if bucket.v else {}) == rows


def test_the_bucketed_queries_are_valid_version_4_plans(monkeypatch):
    from compat.infer import analyze
    from compat.serde import from_doc
    from compat.steps.join import state_buckets as join_buckets
    from compat.steps.source import state_buckets

    topics = {"users": "u", "profiles": "p"}
    for buckets, want in ((None, 64), (16, 16)):
        monkeypatch.setattr(tables, "BUCKETS", buckets)
        names = ["table_aggregate.buckets", "table_table_join.buckets",
                 "table_table_join.join_buckets"]
        docs = tables.plans(topics, {n: "out" for n in names})
        assert sorted(docs) == sorted(names)
        for name, doc in docs.items():
            plan = from_doc(doc)
            analyze(plan)
            srcs = [n for n in plan.nodes.values() if n.step == "source"]
            assert srcs and {(n.version, state_buckets(n)) for n in srcs} == {(4, want)}
            joins = [n for n in plan.nodes.values() if n.step == "join"]
            # join version 3 (its state per bucket of join keys) in join_buckets alone
            assert [(n.version, join_buckets(n, plan)) for n in joins] == (
                [(3, want)] if name.endswith("join_buckets") else
                [(2, None)] if name.startswith("table_table_join") else [])


def test_phases_split_a_run_into_its_batches_and_what_a_start_pays_once():
    progress = [
        {"numInputRows": 100, "durationMs": {"triggerExecution": 5000, "queryPlanning": 3000}},
        {"numInputRows": 50, "durationMs": {"triggerExecution": 1500, "queryPlanning": 100}},
        {"numInputRows": 0, "durationMs": {"triggerExecution": 400, "queryPlanning": 90}},
    ]
    assert tables.phases(progress, 9.0) == {
        "count": 2, "batches": 6.5, "first_planning": 3.0, "start_stop": 2.5, "steady": 3.5}
    # a run whose first trigger read nothing: the first batch with rows is the first
    assert tables.phases(progress[2:] + progress[:2], 9.4)["first_planning"] == 3.0
    assert tables.phases([], 1.0) == {"count": 0, "batches": 0.0, "first_planning": 0.0,
                                      "start_stop": 1.0, "steady": 0.0}
