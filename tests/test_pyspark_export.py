"""``theseus plan export --pyspark`` without Spark: every fixture plan is written as a job
that is valid Python, or refused with the step the DataFrame API cannot express; job
files are recognised by ``check``, ``--against``, the pre-commit hook and the action.
(The round trip through Spark is ``tests/integration/test_pyspark_import.py``.)"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest
import yaml
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
            # an Avro output's job asks the registry for its schema's id
            assert fns == ["value_header"] * (plan.sink.format == "avro") + ["build"], path
            assert f'.option("topic", "{plan.sink.topic}")' in code
            for n in plan.nodes.values():
                if n.step == "source":
                    assert f'.option("subscribe", "{n.topic}")' in code
            assert not steps & set(NOT_EXPORTABLE), path
            written += 1
        else:
            assert steps & set(NOT_EXPORTABLE) or any(w in why for w in (
                "table", "expression keys", "key columns", "watermark delay", "version",
                "config", "names its subject", "Avro record keys"))
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
    hooks = {h["id"]: h for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}
    plans, jobs = hooks["theseus-check"], hooks["theseus-check-jobs"]
    assert all(re.search(plans["files"], n) for n in ("a.json", "b.sql"))
    assert not re.search(plans["files"], "jobs/c.py")  # its environment has no Spark
    assert re.search(jobs["files"], "jobs/c.py") and not re.search(jobs["files"], "a.json")
    # the jobs hook's environment is the runtime extra, kept equal to pyproject's
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["runtime"]
    assert sorted(jobs["additional_dependencies"]) == sorted(extra)
    assert plans["entry"] == jobs["entry"]
    action = (ROOT / "action.yml").read_text()
    assert "*.py" in action and "setup-java" in action


AVRO_OUT = ROOT / "fixtures" / "avro" / "source_reader_default_changed" / "old.json"


def test_an_avro_output_is_to_avro_after_the_registry_header():
    plan = load_plan(str(AVRO_OUT))
    code = to_pyspark(plan)
    assert "from pyspark.sql.avro.functions import from_avro, to_avro" in code
    assert ('F.concat(F.lit(value_header("order_amounts-value", VALUE_SCHEMA)), '
            'to_avro(F.struct("order_id", "amount"), VALUE_SCHEMA)).alias("value")') in code
    assert "SCHEMA_REGISTRY_URL=url spark-submit" in code
    from compat import avro as A
    from compat.steps.sink import avro_schema

    want = A.canonical(avro_schema(plan.sink, plan.info[plan.sink.inputs[0]]))
    assert f"VALUE_SCHEMA = {want!r}" in code


def test_the_exported_header_is_the_id_the_registry_gives(monkeypatch):
    """The job's own registry call, run against the registry stand-in: the header is a
    zero byte and the id, the schema registered under <topic>-value; without
    SCHEMA_REGISTRY_URL the job stops saying so."""
    import os
    import threading
    from http.server import ThreadingHTTPServer

    from tests.test_avro_wire import FakeRegistry

    code = to_pyspark(load_plan(str(AVRO_OUT)))
    tree = ast.parse(code)
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and
             n.name == "value_header"]
    scope: dict = {"os": os}
    exec(compile(ast.Module([fn], []), "job.py", "exec"), scope)  # noqa: S102
    # two schemas registered before: the id is the registry's, not a constant
    FakeRegistry.schemas, FakeRegistry.subjects, FakeRegistry.calls = {1: "a", 2: "b"}, {}, []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), FakeRegistry)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("SCHEMA_REGISTRY_URL",
                           f"http://127.0.0.1:{srv.server_address[1]}/apis/ccompat/v7/")
        schema = '{"type":"record","name":"o","fields":[]}'
        assert scope["value_header"]("orders out-value", schema) == b"\x00\x00\x00\x00\x03"
        assert FakeRegistry.subjects == {"orders%20out-value": [3]}
        assert FakeRegistry.schemas[3] == schema
    finally:
        srv.shutdown()
        srv.server_close()
    monkeypatch.delenv("SCHEMA_REGISTRY_URL")
    with pytest.raises(RuntimeError, match="SCHEMA_REGISTRY_URL is not set"):
        scope["value_header"]("orders-value", schema)
