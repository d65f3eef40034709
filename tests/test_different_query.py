"""Two plans that share nothing (no source topic in common, another output topic) are two
queries: one ``different-query`` finding, not a chain of renames guessed by position."""

from __future__ import annotations

import json

from click.testing import CliRunner

from migrate.cli import main
from tests.conftest import FIXTURES

CASE = FIXTURES / "upgrades" / "unrelated_queries"


def run(*args: str):
    return CliRunner().invoke(main, ["check", *args])


def test_one_finding_names_both_queries_and_says_theseus_run():
    r = run(str(CASE / "old.json"), str(CASE / "new.json"), "--format", "json")
    assert r.exit_code == 3
    report = json.loads(r.output)
    (f,) = report["findings"]
    assert f["code"] == "different-query" and f["effect"] == "unsupported"
    assert "'orders'" in f["message"] and "'payments'" in f["message"]
    assert "theseus run" in f["hint"]
    assert report["alignment"] == []


def test_flags_add_nothing_to_a_different_query():
    r = run(str(CASE / "old.json"), str(CASE / "new.json"), "--format", "json", "--require",
            "backfill,exactly_once,cascading", "--schema-compat", "full", "--allow-migration")
    assert r.exit_code == 3
    assert [f["code"] for f in json.loads(r.output)["findings"]] == ["different-query"]


def test_sharing_a_source_or_the_output_is_an_upgrade(tmp_path):
    old = json.loads((CASE / "old.json").read_text())
    new = json.loads((CASE / "new.json").read_text())
    for keep in ("source", "sink"):
        doc = json.loads(json.dumps(new))
        for n in doc["nodes"]:
            if n["step"] == keep:
                n["topic"] = next(m["topic"] for m in old["nodes"] if m["step"] == keep)
        p = tmp_path / f"{keep}.json"
        p.write_text(json.dumps(doc))
        r = run(str(CASE / "old.json"), str(p), "--format", "json")
        codes = {f["code"] for f in json.loads(r.output)["findings"]}
        assert "different-query" not in codes and codes, keep
