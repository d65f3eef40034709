"""Advice that holds together: every fixture pair under every combination of flags that
changes a verdict, in every format.

For each finding: its severity is ``error`` exactly when it fails the gate under the flags
(``unsupported``, or ``migrate`` without ``--allow-migration``), in every format; its hint
was written for the effect it has (a hint written for another effect is never shown: an
added column that ``--schema-compat backward`` makes unsupported does not say consumers
ignore it, a migration never says to restart on the checkpoint); a hint that says to relax
``--schema-compat`` names the value, and under that value the finding no longer fails.
"""

from __future__ import annotations

import json
import re
from itertools import product

import pytest

from compat.check import SCHEMA_COMPAT, check_plans, load_plan
from compat.findings import CODES, EFFECT_HINTS, HISTORY_NOTE, Finding
from compat.report import render
from tests.conftest import UPGRADES

#: the --require subsets that change findings (live and ordered only add a status line)
REQUIRES = ((), ("backfill",), ("cascading",), ("exactly_once",),
            ("backfill", "cascading", "exactly_once", "live", "ordered"))
FLAGS = list(product(REQUIRES, SCHEMA_COMPAT, (False, True)))
FORMATS = ("text", "json", "markdown", "sarif", "github")
RELAX = re.compile(r"relax --schema-compat to (\w+)(?: \(or (\w+)\))?")


def written_for() -> dict[str, set[str]]:
    """Every stock hint, with the effects it was written for."""
    out: dict[str, set[str]] = {}
    for effect, _sev, _utype, hint in CODES.values():
        out.setdefault(hint, set()).add(effect)
    for effect, hint in EFFECT_HINTS.items():
        out.setdefault(hint, set()).add(effect)
    return out


WRITTEN_FOR = written_for()


def fails_gate(f: Finding | dict, allow_migration: bool) -> bool:
    effect = f.effect if isinstance(f, Finding) else f["effect"]
    return effect == "unsupported" or (effect == "migrate" and not allow_migration)


def loaded(case):
    old = load_plan(str(case / "old.json"))
    return old, load_plan(str(case / "new.json"), reuse=old)


def same_place(a: Finding, b: Finding) -> bool:
    return (a.code, a.old_pointer, a.new_pointer) == (b.code, b.old_pointer, b.new_pointer)


def check_advice(f: Finding, require: tuple[str, ...], schema_compat: str,
                 allow_migration: bool, plans) -> None:
    where = (f.code, f.effect, require, schema_compat, allow_migration, f.hint)
    assert (f.severity == "error") == fails_gate(f, allow_migration), where
    base = f.hint.removesuffix(HISTORY_NOTE)
    if base in WRITTEN_FOR:
        assert f.effect in WRITTEN_FOR[base], where
    if f.effect == "migrate":
        assert "restart" not in f.hint.lower() and "checkpoint" not in f.hint, where
    if f.effect == "unsupported":
        assert "ignore" not in f.hint and "Restart" not in f.hint, where
    if "--require backfill" in f.hint:
        assert f.effect == "in_place" and f.history and "backfill" not in require, where
    if "--schema-compat" in f.hint and "relax" in f.hint:
        m = RELAX.search(f.hint)
        assert m, where  # "relax --schema-compat" says to which value
        for value in filter(None, m.groups()):
            assert value in SCHEMA_COMPAT and value != schema_compat, where
            req = [r for r in require if not (r == "cascading" and
                                              "drop --require cascading" in f.hint)]
            again = check_plans(*plans, require=req, schema_compat=value)
            assert not any(same_place(f, g) and g.effect == "unsupported"
                           for g in again.findings), (where, value)


def check_formats(report, allow_migration: bool) -> None:
    """Every format shows as errors exactly the findings that fail the gate."""
    errors = sum(fails_gate(f, allow_migration) for f in report.findings)
    out = {fmt: render(report, fmt) for fmt in FORMATS}
    assert out["text"].count("\n✗ [") == errors
    assert out["markdown"].count("\n| ✗ |") == errors
    assert sum(line.startswith("::error ") for line in out["github"].splitlines()) == errors
    results = json.loads(out["sarif"])["runs"][0]["results"]
    assert sum(r["level"] == "error" for r in results) == errors
    for r in results:
        assert r["properties"]["effect"] in ("in_place", "none") or \
            (r["level"] == "error") == fails_gate(r["properties"], allow_migration)
    doc = json.loads(out["json"])
    assert sum(f["severity"] == "error" for f in doc["findings"]) == errors
    gate = 0 if doc["verdict"] in ("identical", "in_place") or \
        (doc["verdict"] == "migrate" and allow_migration) else \
        {"migrate": 1, "unsupported": 3}[doc["verdict"]]
    assert doc["exit_code"] == report.exit_code == gate
    assert f"(exit {gate})" in out["text"].splitlines()[0]


@pytest.mark.parametrize("case", UPGRADES, ids=lambda p: p.name)
def test_advice_matches_effect_under_every_flag(case):
    plans = loaded(case)
    for require, schema_compat, allow in FLAGS:
        report = check_plans(*plans, require=list(require), schema_compat=schema_compat,
                             allow_migration=allow)
        for f in report.findings:
            check_advice(f, require, schema_compat, allow, plans)
        check_formats(report, allow)


def test_an_added_column_under_backward_does_not_say_consumers_ignore_it():
    case = next(c for c in UPGRADES if c.name == "project_column_added_end")
    report = check_plans(*loaded(case), schema_compat="backward")
    (f,) = [f for f in report.findings if f.code == "output-column-added"]
    assert f.effect == "unsupported" and "ignore" not in f.hint
    assert "relax --schema-compat to forward" in f.hint
    (g,) = [g for g in check_plans(*loaded(case)).findings if g.code == f.code]
    assert g.effect == "in_place" and "ignore the new column" in g.hint


def test_allow_migration_makes_migrate_findings_warnings_on_github():
    case = next(c for c in UPGRADES if c.name == "group_by_key_changed")
    plans = loaded(case)
    strict = render(check_plans(*plans), "github")
    allowed = render(check_plans(*plans, allow_migration=True), "github")
    assert "::error " in strict and "::error " not in allowed
    assert "::warning " in allowed and "theseus aggregate-key-changed (migrate)" in allowed


def test_a_stateful_version_change_needing_migration_does_not_say_restart():
    case = next(c for c in UPGRADES if c.name == "recursive_v1_to_v2")
    report = check_plans(*loaded(case))
    (f,) = [f for f in report.findings if f.code == "step-version-changed"]
    assert f.effect == "migrate" and "live migration" in f.hint


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_cli_with_allow_migration_passes_and_shows_no_error(fmt):
    from click.testing import CliRunner

    from migrate.cli import main

    case = next(c for c in UPGRADES if c.name == "group_by_key_changed")
    args = ["check", str(case / "old.json"), str(case / "new.json"), "--format", fmt]
    strict = CliRunner().invoke(main, args)
    allowed = CliRunner().invoke(main, [*args, "--allow-migration"])
    assert (strict.exit_code, allowed.exit_code) == (1, 0)
    marks = {"text": "✗ [", "json": '"severity": "error"', "markdown": "| ✗ |",
             "sarif": '"level": "error"', "github": "::error "}
    assert marks[fmt] in strict.output and marks[fmt] not in allowed.output
