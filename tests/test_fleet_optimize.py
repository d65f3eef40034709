"""``theseus fleet optimize``: a shared subplan computed once, through an internal topic."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from compat.check import check_plans, load_plan
from compat.fleet.graph import load_fleet
from compat.fleet.optimize import optimize, optimize_dir, shared_topic
from compat.fleet.signature import shared_subplans, signatures
from migrate.cli import main
from tests.fleet_util import agg, filt, plan, proj, sink, source

FLEET = Path(__file__).resolve().parent.parent / "fixtures" / "fleets" / "share"


def test_fixture_fleet_is_rewritten_and_valid(tmp_path):
    out = tmp_path / "out"
    result = optimize_dir(str(FLEET), str(out))
    (rw,) = result.rewrites
    assert rw.topic == shared_topic(rw.shared.signature)
    assert rw.topic == "theseus.shared." + rw.shared.signature[:12]
    assert rw.partitions == 3
    assert sorted(q for q, _ in rw.consumers) == ["big_orders", "eu_revenue", "region_totals"]
    assert rw.renamed == ("big_orders",)  # eu_revenue's names are the template's
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == [f"_shared/{rw.query}.json", "big_orders.json", "eu_revenue.json",
                     "region_totals.json", "test_orders.sql"]
    # the unchanged query is copied byte for byte
    assert (out / "test_orders.sql").read_bytes() == (FLEET / "test_orders.sql").read_bytes()
    for f in files:
        load_plan(str(out / f))
    # each rewritten consumer vs its original: a live migration, its source topic changed
    for q in ("big_orders", "eu_revenue", "region_totals"):
        report = check_plans(load_plan(str(FLEET / f"{q}.json")), load_plan(str(out / f"{q}.json")))
        assert report.verdict == "migrate"
        assert "source-topic-changed" in {f.code for f in report.findings}
    # the fleet reads the source topic twice now (shared query and test_orders), and
    # the optimized fleet has nothing left to share
    fleet = load_fleet(str(out))
    assert fleet.producers[rw.topic] == rw.query
    assert optimize({n: q.plan for n, q in fleet.queries.items()}).rewrites == []


def test_consumers_keep_their_names_and_the_watermark(tmp_path):
    out = tmp_path / "out"
    result = optimize_dir(str(FLEET), str(out))
    topic = result.rewrites[0].topic
    big = json.loads((out / "big_orders.json").read_text())
    src, ren = big["nodes"][0], big["nodes"][1]
    assert src["topic"] == topic and src["id"] == "priced_shared"
    assert src["event_time"] == {"column": "ts", "watermark": "30 seconds"}
    assert ren == {"id": "priced", "step": "project", "version": 1,
                   "inputs": ["priced_shared"],
                   "columns": [{"name": "id", "expr": "`order_id`"},
                               {"name": "region", "expr": "`region`"},
                               {"name": "value", "expr": "`total`"},
                               {"name": "ts", "expr": "`ts`"}]}
    # the windowed aggregate downstream still has its event time
    totals = load_plan(str(out / "region_totals.json"))
    assert totals.info["per_minute"].watermarks == frozenset({"window"})
    # the shared query is the template's subplan with a sink to the internal topic
    shared = load_plan(str(out / "_shared" / f"{result.rewrites[0].query}.json"))
    assert shared.sink.topic == topic and shared.sink.mode == "append"
    assert shared.metadata["shared"]["signature"] == result.rewrites[0].shared.signature
    assert signatures(shared)[shared.sink.inputs[0]] == result.rewrites[0].shared.signature


def test_a_branch_reading_the_prefix_stays():
    q1 = plan("q1", source(), filt("f", "src", "a > 0"), proj("p", "f", ("x", "a + b")),
              sink("out", "p", "o1"))

    def q2(branch_input):
        return plan("q2", source(), filt("f", "src", "0 < a"),
                    proj("p", "f", ("x", "b + a")),
                    source("t", topic="other", schema=[{"name": "x", "type": "int"}]),
                    {"id": "u", "step": "union", "inputs": ["p", "t"]},
                    filt("g", branch_input, "b > 1"), proj("pg", "g", ("x", "b")),
                    {"id": "u2", "step": "union", "inputs": ["u", "pg"]},
                    sink("out", "u2", "o2"))
    res = optimize({"q1": q1, "q2": q2("src")})
    (rw,) = res.rewrites
    assert rw.shared.members == (("q1", "p"), ("q2", "p"))
    new = res.plans["q2"]
    assert new.nodes["p"].step == "source" and new.nodes["p"].topic == rw.topic
    assert new.nodes["src"].step == "source" and "f" not in new.nodes  # g still reads src
    assert set(res.plans["q1"].nodes) == {"p", "out"}
    # the branch reads the filter: it stays in q2, which now shares it with the shared
    # query, so the filter becomes a shared query of its own that both read
    res = optimize({"q1": q1, "q2": q2("f")})
    first, second = res.rewrites
    assert second.consumers == (("q2", "f"), (first.query, "f"))
    assert res.plans[first.query].nodes["f"].topic == second.topic
    assert res.plans["q2"].nodes["f"].topic == second.topic
    assert res.start_order() == [second.query, first.query]
    assert res.migrate() == ["q1", "q2"]


def test_updates_and_nondeterminism_are_not_shared():
    def q(name, pred, count):  # another output name: not complete sharing
        return plan(name, source(), filt("f", "src", pred),
                    agg("g", "f", [("r", "region")], [(count, "count", ["*"])]),
                    sink("out", "g", name, mode="update", keys=["r"]))
    res = optimize({"q1": q("q1", "a > 0", "n"), "q2": q("q2", "0 < a", "cnt")})
    assert res.rewrites == []
    ((sh, why),) = res.skipped
    assert "updates" in why
    r1 = plan("r1", source(), filt("f", "src", "rand() < 0.1"), proj("p", "f", ("a", "a")),
              filt("g", "p", "a > 1"), sink("out", "g", "o1"))
    r2 = plan("r2", source(), filt("f", "src", "rand() < 0.1"), proj("p", "f", ("a", "a")),
              filt("g", "p", "a > 2"), sink("out", "g", "o2"))
    res = optimize({"r1": r1, "r2": r2})
    assert res.rewrites == [] and "nondeterministic" in res.skipped[0][1]


def test_nested_sharing_becomes_a_chain_of_shared_queries():
    def q(name, tail):
        return plan(name, source(), filt("f", "src", "a > 0"), *tail)
    plans = {
        "q1": q("q1", [proj("p", "f", ("x", "a + b")), filt("g", "p", "x > 5"),
                       sink("out", "g", "o1")]),
        "q2": q("q2", [proj("p", "f", ("x", "a + b")), filt("g", "p", "x > 6"),
                       sink("out", "g", "o2")]),
        "q3": q("q3", [proj("p", "f", ("y", "b * 2")), sink("out", "p", "o3")]),
    }
    res = optimize(plans)
    assert [len(rw.consumers) for rw in res.rewrites] == [3, 2]
    first, second = res.rewrites
    assert res.plans[second.query].nodes["f"].topic == first.topic  # reads the first one
    assert not [sh for sh in shared_subplans(res.plans) if sh.kind == "partial"
                and sh.deterministic and len(sh.queries) > 1 and sh.steps > 1
                and any(res.plans[q].nodes[n].step != "project" for q, n in sh.members)]
    for p in res.plans.values():
        assert p.info  # every plan was validated


def test_an_existing_shared_query_is_reused():
    q1 = plan("q1", source(), filt("f", "src", "a > 0"), proj("p", "f", ("x", "a + b")),
              sink("out", "p", "o1"))
    q2 = plan("q2", source(), filt("f", "src", "0 < a"), proj("p", "f", ("x", "b + a")),
              filt("g", "p", "x > 1"), sink("out", "g", "o2"))
    first = optimize({"q1": q1, "q2": q2})
    (rw,) = first.rewrites
    # a third query computing the same prefix joins later
    q3 = plan("q3", source(), filt("f", "src", "a > 0"), proj("p", "f", ("z", "a + b")),
              sink("out", "p", "o3"))
    again = optimize({**first.plans, "q3": q3})
    (rw2,) = again.rewrites
    assert not rw2.new_query and rw2.query == rw.query and rw2.topic == rw.topic
    assert rw2.consumers == (("q3", "p"),)
    assert again.plans["q3"].nodes["p"].step == "project"  # renames x to z


def test_cli(tmp_path):
    out = tmp_path / "o"
    r = CliRunner().invoke(main, ["fleet", "optimize", str(FLEET), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "now reads theseus.shared." in r.output
    assert "wrote 5 queries" in r.output
    again = CliRunner().invoke(main, ["fleet", "optimize", str(FLEET), "-o", str(out)])
    assert again.exit_code == 2 and "not empty" in again.output
    nothing = CliRunner().invoke(main, ["fleet", "optimize", str(out), "-o",
                                        str(tmp_path / "o2")])
    assert nothing.exit_code == 0 and "nothing to share" in nothing.output


def test_fleet_check_of_the_rewrite_says_how_to_deploy_it(tmp_path):
    """fleet check before -> after: the shared query is started first (it is new), then the
    rewritten queries migrate live in the next wave; the untouched query stays identical."""
    from compat.fleet.check import check_dirs
    from compat.fleet.report import render

    out = tmp_path / "out"
    (rw,) = optimize_dir(str(FLEET), str(out)).rewrites
    report = check_dirs([str(FLEET), str(out)])
    assert report.verdict == "migrate" and report.exit_code == 1
    assert report.waves == [[rw.query], ["big_orders", "eu_revenue", "region_totals"]]
    by = {r.query: r for r in report.queries}
    assert by[rw.query].status == "new" and by[rw.query].wave == 0
    assert by["test_orders"].verdict == "identical"
    for q in ("big_orders", "eu_revenue", "region_totals"):
        assert by[q].verdict == "migrate" and by[q].wave == 1
        assert "source-topic-changed" in {f.code for f in by[q].findings}
    text = render(report, "text")
    assert f"migration waves (upstream first): 1. {rw.query} (new: theseus run); " \
        "2. big_orders, eu_revenue, region_totals" in text
