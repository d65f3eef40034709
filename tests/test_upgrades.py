"""Golden upgrade cases: every fixtures/upgrades/<case>/ carries its expected verdict and
finding codes; one parametrized test runs them all through the CLI in-process."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from migrate.cli import main
from tests.conftest import UPGRADES

EXIT = {"identical": 0, "in_place": 0, "migrate": 1, "unsupported": 3}


def test_there_are_enough_cases():
    assert len(UPGRADES) >= 40


@pytest.mark.parametrize("case", UPGRADES, ids=lambda p: p.name)
def test_upgrade_case(case):
    expect = json.loads((case / "expect.json").read_text())
    args = ["check", str(case / "old.json"), str(case / "new.json"), "--format", "json"]
    if expect.get("require"):
        args += ["--require", expect["require"]]
    if expect.get("schema_compat"):
        args += ["--schema-compat", expect["schema_compat"]]
    result = CliRunner().invoke(main, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        result.output
    report = json.loads(result.output)
    assert report["verdict"] == expect["verdict"], report["findings"]
    assert sorted({f["code"] for f in report["findings"]}) == sorted(expect["codes"])
    assert result.exit_code == EXIT[expect["verdict"]]
    # Every finding points somewhere in at least one of the two plans.
    for f in report["findings"]:
        assert f["old"]["pointer"] is not None or f["new"]["pointer"] is not None, f


def test_cases_cover_every_step_type_and_upgrade_type():
    from compat.model import STEPS

    steps, types = set(), set()
    for case in UPGRADES:
        for name in ("old.json", "new.json"):
            doc = json.loads((case / name).read_text())
            for n in doc["nodes"]:
                steps.add(n["step"])
                for b in n.get("body", []):
                    steps.add(b["step"])
        result = CliRunner().invoke(main, ["check", str(case / "old.json"),
                                           str(case / "new.json"), "--format", "json"])
        types.update(json.loads(result.output)["upgrade_types"])
    assert steps >= set(STEPS) - {"stop_gate", "start_gate"}
    assert types >= {"transparent", "data_selection", "schema_evolution", "source_modifying",
                     "topology", "scaling"}
