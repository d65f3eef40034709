"""Findings on PySpark jobs point at the Python line of the DataFrame call that made the
step (``x-origin``, ``migrate.adopt.origins``), imported on real Spark (no Kafka: nothing
is started).

* a job whose lines are marked: every node's origin is its marked call, a call made in a
  helper module beside the job names that module;
* a fixture job changed in a copy: ``check --format github`` annotates the changed call's
  file and line, and ``check --against HEAD`` names the old side ``HEAD:path``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from migrate.cli import main

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "fixtures" / "pyspark"

pytestmark = pytest.mark.integration

HELPER = textwrap.dedent("""\
    from pyspark.sql import functions as F


    def parsed(spark, topic, schema):
        return (spark.readStream.format("kafka")
                .option("kafka.bootstrap.servers", "127.0.0.1:1")
                .option("subscribe", topic)
                .load()  # @source
                .select(F.from_json(F.col("value").cast("string"), schema).alias("v"))
                .select("v.*"))


    def big(df):
        return df.where("amount > 100")  # @filter
    """)

JOB = textwrap.dedent("""\
    from pyspark.sql import functions as F

    from helpers import big, parsed


    def build(spark):
        orders = parsed(spark, "orders", "order_id STRING, region STRING, amount DOUBLE")
        shaped = (big(orders)
                  .withColumn("region", F.upper("region")))  # @project
        totals = (shaped.groupBy("region")
                  .agg(F.sum("amount").alias("total")))  # @aggregate
        return (totals.select(F.to_json(F.struct("region")).alias("key"),
                              F.to_json(F.struct("region", "total")).alias("value"))
                .writeStream.format("kafka")
                .option("topic", "totals")  # @sink
                .outputMode("update"))
    """)


def _marks(text: str) -> dict[str, int]:
    return {ln.split("# @")[1].strip(): i for i, ln in enumerate(text.splitlines(), 1)
            if "# @" in ln}


def _cli(*args: str):
    return CliRunner().invoke(main, list(args))


def test_every_node_points_at_its_dataframe_call(kafka_connector, tmp_path, monkeypatch):
    from migrate.adopt import import_job

    monkeypatch.setenv("KAFKA_BOOTSTRAP", "127.0.0.1:1")
    (tmp_path / "helpers.py").write_text(HELPER)
    (tmp_path / "totals.py").write_text(JOB)
    doc = import_job(str(tmp_path / "totals.py"), partitions=1)
    got = {n["step"]: n["x-origin"] for n in doc["nodes"]}
    job, helper = _marks(JOB), _marks(HELPER)
    assert (got["source"]["file"], got["source"]["line"]) == ("helpers.py", helper["source"])
    assert (got["filter"]["file"], got["filter"]["line"]) == ("helpers.py", helper["filter"])
    for step in ("project", "aggregate", "sink"):
        assert (got[step]["file"], got[step]["line"]) == ("totals.py", job[step]), (step, got)
    # the column is where Python puts the call: in a chain over lines, the method's name
    line = JOB.splitlines()[job["aggregate"] - 1]
    assert line[got["aggregate"]["column"] - 1:].startswith("agg("), got["aggregate"]


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=repo,
                   check=True, capture_output=True)


def test_a_changed_call_is_annotated_at_its_python_line(kafka_connector, tmp_path,
                                                        monkeypatch):
    """The filter of fixtures/pyspark/filter_project changes (and moves down three lines):
    the annotation names the new file and the new line; under --against, the text names
    the old side at HEAD."""
    monkeypatch.setenv("KAFKA_BOOTSTRAP", "127.0.0.1:1")
    monkeypatch.delenv("TOPIC_PREFIX", raising=False)
    repo = tmp_path / "repo"
    (repo / "jobs").mkdir(parents=True)
    job = repo / "jobs" / "orders.py"
    shutil.copy(FIX / "filter_project" / "job.py", job)
    old_text = job.read_text()
    old_line = next(i for i, ln in enumerate(old_text.splitlines(), 1)
                    if "orders.where(" in ln)
    assert "> 100)" in old_text
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "v1")
    new_text = old_text.replace("    big = orders.where(", "    # the threshold is\n"
                                "    # a business rule\n    #\n    big = orders.where(") \
        .replace("> 100)", "> 500)")
    job.write_text(new_text)
    new_line = old_line + 3
    assert new_text.splitlines()[new_line - 1].lstrip().startswith("big = orders.where(")

    old_copy = tmp_path / "old_orders.py"
    old_copy.write_text(old_text)
    r = _cli("check", str(old_copy), str(job), "--format", "github")
    assert r.exit_code == 0, r.output
    (ann,) = [ln for ln in r.output.splitlines() if "filter-changed" in ln]
    assert ann.startswith(f"::notice file={job},line={new_line},col="), ann

    monkeypatch.chdir(repo)
    r = _cli("check", "--against", "HEAD", "jobs", "--format", "github")
    assert r.exit_code == 0, r.output
    (ann,) = [ln for ln in r.output.splitlines() if "filter-changed" in ln]
    assert ann.startswith(f"::notice file=jobs/orders.py,line={new_line},col="), ann
    r = _cli("check", "--against", "HEAD", "jobs")
    assert f"old filter (HEAD:jobs/orders.py:{old_line}:" in r.output, r.output
    assert f"new filter (jobs/orders.py:{new_line}:" in r.output, r.output
    assert "theseus-ref-" not in r.output
    sarif = json.loads(_cli("check", "--against", "HEAD", "jobs", "--format",
                            "sarif").output)
    (res,) = [x for x in sarif["runs"][0]["results"] if x["ruleId"] == "filter-changed"]
    loc = res["locations"][0]["physicalLocation"]
    assert (loc["artifactLocation"]["uri"], loc["region"]["startLine"]) == \
        ("jobs/orders.py", new_line)
