"""The same change, written as SQL and as a hand-written JSON plan, gets one verdict
(``tests/forms_util.py`` says how the forms are made and what may differ; the PySpark form
needs Spark: ``tests/integration/test_three_forms.py``)."""

from __future__ import annotations

import json

import pytest

from tests.forms_util import SQL_CASES, agree, compiled, outcome, unpruned


def test_unpruned_adds_the_rule_to_those_a_script_leaves_out():
    assert unpruned("SELECT 1;").startswith(
        "SET theseus.optimizer.excluded_rules = 'prune_columns';")
    text = "SET theseus.optimizer.excluded_rules = 'predicate_pushdown';\nSELECT 1;"
    assert "'predicate_pushdown,prune_columns'" in unpruned(text)


@pytest.mark.parametrize("case", SQL_CASES, ids=lambda p: p.name)
def test_sql_and_json_agree(case, tmp_path):
    forms = {}
    for form, prune in (("sql", True), ("json", False)):
        paths = []
        for side in ("old", "new"):
            p = tmp_path / f"{form}.{side}.json"
            p.write_text(json.dumps(compiled(case, side, prune)))
            paths.append(str(p))
        forms[form] = outcome(case, paths)
    assert agree(forms["sql"], forms["json"]), forms
    expect = json.loads((case / "expect.json").read_text())
    assert forms["json"][0] == expect["verdict"], forms
