"""The same change in three forms gets one verdict: every SQL upgrade pair of the fixtures
as SQL, as a hand-written JSON plan, and as a PySpark job (``tests/forms_util.py`` says how
each form is made and what may differ).  The job is the JSON plan exported with
``plan export --pyspark`` and imported back with ``plan import``: a pair is in this test
when the DataFrame API can write both of its sides."""

from __future__ import annotations

import json

import pytest

from compat.check import load_plan
from compat.export import exportable, to_pyspark
from tests.forms_util import SQL_CASES, agree, compiled, outcome

pytestmark = pytest.mark.integration


def test_sql_json_and_pyspark_agree(kafka_connector, tmp_path, monkeypatch):
    from migrate.adopt import import_job

    monkeypatch.setenv("KAFKA_BOOTSTRAP", "127.0.0.1:1")  # no broker: partitions from flag
    disagree, written = [], []
    for case in SQL_CASES:
        forms: dict[str, list[str]] = {"sql": [], "json": [], "pyspark": []}
        for side in ("old", "new"):
            for form, prune in (("sql", True), ("json", False)):
                p = tmp_path / f"{case.name}.{form}.{side}.json"
                p.write_text(json.dumps(compiled(case, side, prune)))
                forms[form].append(str(p))
            plan = load_plan(forms["json"][-1])
            if exportable(plan) is not None:
                continue
            job = tmp_path / f"{case.name}_{side}.py"
            job.write_text(to_pyspark(plan))
            parts = {n.topic: n.partitions for n in plan.nodes.values() if n.step == "source"}
            doc = import_job(str(job), partitions=max(parts.values()),
                             delivery=plan.sink.delivery)
            for n in doc["nodes"]:
                if n["step"] == "source":
                    n["partitions"] = parts[n["topic"]]
            p = tmp_path / f"{case.name}.pyspark.{side}.json"
            p.write_text(json.dumps(doc))
            forms["pyspark"].append(str(p))
        got = {form: outcome(case, paths) for form, paths in forms.items() if len(paths) == 2}
        if "pyspark" in got:
            written.append(case.name)
        if not all(agree(got["sql"], o) for o in got.values()):
            disagree.append(f"{case.name}: " + "; ".join(
                f"{form} {v} {sorted(c)}" for form, (v, c) in got.items()))
    assert not disagree, "\n".join(disagree)
    # the pairs the DataFrame API can write: the stream-stream join reading a new column
    # through the join is one of them
    assert len(written) >= 40 and "join_stream_stream_column_newly_read" in written, written
