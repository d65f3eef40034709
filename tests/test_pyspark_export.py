"""``theseus plan export --pyspark`` without Spark: every fixture plan is written as a job
that is valid Python, or refused with the step the DataFrame API cannot express; job
files are recognised by ``check``, ``--against``, the pre-commit hook and the action.
(The round trip through Spark is ``tests/integration/test_pyspark_import.py``.)"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from compat.check import is_job, load_plan
from compat.export import NOT_EXPORTABLE, exportable, to_pyspark
from compat.gitcheck import _is_plan_text
from migrate.cli import main

ROOT = Path(__file__).resolve().parents[1]
PLANS = sorted(p for p in (ROOT / "fixtures").rglob("*.json")
               if p.name in ("plan.json", "old.json", "new.json", "ship_load.json")
               and "fleets" not in p.parts)


def _plans():
    out = []
    for p in PLANS:
        try:
            out.append((p, load_plan(str(p))))
        except Exception:  # fixtures of invalid plans
            continue
    return out


def test_every_fixture_plan_is_written_or_refused_with_its_step():
    written = refused = 0
    for path, plan in _plans():
        why = exportable(plan)
        steps = {n.step for n in plan.nodes.values()}
        if why is None:
            code = to_pyspark(plan)
            tree = ast.parse(code, str(path))  # valid Python
            fns = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
            assert fns == ["build"], path
            assert f'.option("topic", "{plan.sink.topic}")' in code
            for n in plan.nodes.values():
                if n.step == "source":
                    assert f'.option("subscribe", "{n.topic}")' in code
            assert not steps & set(NOT_EXPORTABLE), path
            written += 1
        else:
            assert steps & set(NOT_EXPORTABLE) or any(w in why for w in (
                "table", "expression keys", "key columns", "watermark delay", "version",
                "config", "writes Avro", "Avro record keys"))
            with pytest.raises(Exception, match="cannot be written as a PySpark job"):
                to_pyspark(plan)
            refused += 1
    assert written >= 20 and refused >= 1, (written, refused)


def test_export_cli_refuses_a_top_n_plan_naming_the_step():
    top_n = ROOT / "fixtures" / "qtt" / "top_n" / "plan.json"
    r = CliRunner().invoke(main, ["plan", "export", str(top_n), "--pyspark"])
    assert r.exit_code == 2
    assert "top_n" in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_export_writes_each_step_as_the_dataframe_api():
    plan = load_plan(str(ROOT / "fixtures" / "qtt" / "stream_join" / "plan.json"))
    code = to_pyspark(plan)
    assert '.withWatermark("ts", "1 minute")' in code
    assert ".join(payments.alias(\"payments\"), F.expr(\"(orders.order_id = " \
           "payments.order_id) AND (payments.ts BETWEEN orders.ts AND orders.ts + " \
           "INTERVAL 10 MINUTES)\"), \"inner\")" in code
    assert 'F.col("payments.ts").alias("payments_ts")' in code
    assert "--delivery exactly_once --partitions 2" in code


def test_job_files_are_plans_for_check_and_the_hooks():
    assert is_job("jobs/orders.py") and is_job("jobs/orders.py:build_v2")
    assert not is_job("plans/orders.json") and not is_job("a.sql")
    assert _is_plan_text(b"def build(spark):\n    return df.writeStream.format('kafka')\n",
                         "jobs/x.py")
    assert not _is_plan_text(b"def sink(df):\n    return df.writeStream\n", "jobs/h.py")
    assert not _is_plan_text(b"SCHEMA = 'a string'", "jobs/schemas.py")
    hook = (ROOT / ".pre-commit-hooks.yaml").read_text()
    files = re.search(r"files: (\S+)", hook).group(1)
    for name in ("a.json", "b.sql", "jobs/c.py"):
        assert re.search(files, name), name
    action = (ROOT / "action.yml").read_text()
    assert "*.py" in action and "setup-java" in action
