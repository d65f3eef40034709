"""``theseus plan diff``: every pair of steps (enforcing and passive) with the fields that
changed, old -> new, and the steps added and removed; ``--format text|json|html`` and ``-o``."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from compat.check import check_files
from compat.plandiff import FieldChange, diff, field_changes
from migrate.cli import main
from tests.conftest import UPGRADES

CASE = {c.name: c for c in UPGRADES}


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def pair(name, suffix="json"):
    return str(CASE[name] / f"old.{suffix}"), str(CASE[name] / f"new.{suffix}")


def plan_diff(name, suffix="json"):
    return diff(check_files(*pair(name, suffix), pair_passive=True))


def step(d, old=None, new=None):
    return next(s for s in d.steps if (old is None or s.old == old) and
                (new is None or s.new == new))


# -- field-level differences ------------------------------------------------------------------


def test_a_changed_predicate_is_old_to_new():
    assert field_changes({"step": "filter", "predicate": "a > 1"},
                         {"step": "filter", "predicate": "a > 2"}) == [
        FieldChange("predicate", "changed", "a > 1", "a > 2")]


def test_named_items_are_compared_by_name_not_by_position():
    old = {"aggregates": [{"name": "load", "function": "sum", "args": ["w"]},
                          {"name": "top", "function": "max", "args": ["w"]}]}
    new = {"aggregates": [{"name": "n", "function": "count", "args": ["*"]},
                          {"name": "load", "function": "sum", "args": ["weight"]},
                          {"name": "top", "function": "max", "args": ["w"]}]}
    # adding 'n' in front is one change, not a shift of every aggregate after it
    assert field_changes(old, new) == [
        FieldChange("aggregates[load].args[0]", "changed", "w", "weight"),
        FieldChange("aggregates[n]", "added", new={"name": "n", "function": "count",
                                                   "args": ["*"]})]


def test_a_new_order_of_named_items_is_its_own_change():
    old = {"group_by": [{"name": "a", "expr": "a"}, {"name": "b", "expr": "b"}]}
    new = {"group_by": [{"name": "b", "expr": "b"}, {"name": "a", "expr": "a"}]}
    assert field_changes(old, new) == [FieldChange("group_by", "reordered", ["a", "b"],
                                                   ["b", "a"])]


def test_windows_and_plain_lists():
    old = {"window": {"type": "tumbling", "column": "ts", "size": "5 minutes"},
           "key_columns": ["a", "b"]}
    new = {"key_columns": ["b", "a"]}
    changes = field_changes(old, new)
    assert FieldChange("window", "removed", old=old["window"]) in changes
    assert FieldChange("key_columns[0]", "changed", "a", "b") in changes
    assert field_changes(new, old)[0].text().startswith('window: added {"type": "tumbling"')


# -- pairing: enforcing and passive steps --------------------------------------------------------


def test_a_changed_filter_is_a_passive_pair_with_its_predicate():
    d = plan_diff("filter_changed_before_aggregate")
    s = step(d, old="valid")
    assert (s.status, s.new, s.klass) == ("changed", "valid", "passive")
    assert s.changes == (FieldChange("predicate", "changed", "amount > 0",
                                     "amount > 0 AND quantity > 0"),)
    assert {x.status for x in d.steps if x is not s} == {"unchanged"}


def test_group_key_and_window_changes_are_listed_on_the_aggregate():
    s = step(plan_diff("group_by_key_changed"), old="totals")
    assert s.changes == (FieldChange("group_by[customer_id].expr", "changed", "customer_id",
                                     "lower(customer_id)"),)
    s = step(plan_diff("aggregate_tumbling_window_changed"), old="per_page")
    assert s.changes == (FieldChange("window.size", "changed", "5 minutes", "10 minutes"),)


def test_added_and_removed_steps_are_marked():
    d = plan_diff("filter_added_stream")
    assert [(s.status, s.new) for s in d.steps if s.status != "unchanged"] == [
        ("added", "not_test")]
    d = plan_diff("filter_removed_stream")
    assert [(s.status, s.old) for s in d.steps if s.status != "unchanged"] == [
        ("removed", "big")]


@pytest.mark.parametrize("name", ["stateful_dedup_added_before_aggregate",
                                  "stateful_dedup_removed"])
def test_passive_steps_around_an_inserted_or_removed_enforcing_step_stay_paired(name):
    d = plan_diff(name)
    changed = [(s.status, s.step) for s in d.steps if s.status != "unchanged"]
    assert changed == [("added" if "added" in name else "removed", "deduplicate")]


def test_renamed_steps_pair_old_and_new_ids():
    d = plan_diff("join_stream_stream_ids_renamed")
    assert step(d, old="paid").new == "matched"
    assert step(d, old="orders").new == "o" and step(d, old="orders").status == "unchanged"


def test_plan_level_changes_are_listed():
    d = plan_diff("scaling_state_partitions_stateful")
    assert d.plan == (FieldChange("config.state_partitions", "changed", 8, 16),)


def test_sql_plans_diff_too():
    d = plan_diff("filter_added_before_aggregate", "sql")
    s = step(d, old="where_1")
    assert s.changes == (FieldChange("predicate", "changed", "amount > 0",
                                     "amount > 0 AND region = 'eu'"),)


@pytest.mark.parametrize("case", UPGRADES, ids=lambda p: p.name)
def test_pairing_passive_steps_changes_no_finding(case):
    old, new = str(case / "old.json"), str(case / "new.json")
    plain = check_files(old, new)
    paired = check_files(old, new, pair_passive=True)
    assert plain.passive_alignment == []
    assert [f.to_json() for f in paired.findings] == [f.to_json() for f in plain.findings]
    assert paired.alignment == plain.alignment
    d = diff(paired)
    # every step of both plans is listed: in a pair, or as added or removed
    assert {s.old for s in d.steps} - {None} == set(paired.old.nodes)
    assert {s.new for s in d.steps} - {None} == set(paired.new.nodes)
    if paired.verdict == "identical":  # nothing the check noticed, so nothing flagged
        assert all(s.findings == 0 or s.status != "changed" for s in d.steps
                   if s.klass == "passive")


def test_a_change_of_form_is_shown_and_said_to_have_no_finding():
    d = plan_diff("transparent_filter_reformatted")
    assert d.report.verdict == "identical"
    s = step(d, old="big")
    assert s.status == "changed" and s.findings == 0
    assert s.changes[0].path == "predicate"
    r = run("plan", "diff", *pair("transparent_filter_reformatted"))
    assert "  ~ big: filter [passive] (no finding: same meaning for the check)" in r.output


# -- the command ------------------------------------------------------------------------------


def test_text_lists_pairs_with_changed_fields_then_the_report():
    r = run("plan", "diff", *pair("filter_changed_before_aggregate"))
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].startswith("steps: 1 changed, 0 added, 0 removed, 3 unchanged")
    i = lines.index("  ~ valid: filter [passive] (1 finding)")
    assert lines[i + 1] == '      predicate: "amount > 0" -> "amount > 0 AND quantity > 0"'
    assert "  = orders: source [enforcing]" in lines
    assert "verdict: in_place" in r.output


def test_json_format_and_output_file(tmp_path):
    out = tmp_path / "sub.json"
    r = run("plan", "diff", *pair("group_by_key_changed"), "--format", "json", "-o", out)
    assert r.exit_code == 1 and r.output == ""
    doc = json.loads(out.read_text())
    assert doc["format"] == "theseus.diff/1" and doc["verdict"] == "migrate"
    totals = next(s for s in doc["steps"] if s["old"] == "totals")
    assert totals == {"status": "changed", "old": "totals", "new": "totals",
                      "step": "aggregate", "class": "enforcing", "findings": 1,
                      "changes": [{"path": "group_by[customer_id].expr", "kind": "changed",
                                   "old": "customer_id", "new": "lower(customer_id)"}]}
    assert doc["counts"] == {"changed": 1, "added": 0, "removed": 0, "unchanged": 3}
    assert doc["report"]["findings"][0]["code"] == "aggregate-key-changed"


def test_html_format_to_stdout_and_the_html_alias(tmp_path):
    r = run("plan", "diff", *pair("filter_added_stream"), "--format", "html")
    assert r.exit_code == 0 and r.output.startswith("<!doctype html>")
    page = tmp_path / "d.html"
    r = run("plan", "diff", *pair("filter_added_stream"), "--html", page)
    assert r.exit_code == 0
    assert r.output.startswith(f"wrote {page}\nsteps: 0 changed, 1 added")
    assert 'data-id="not_test" data-effect="in_place" data-status="added"' in page.read_text()
