"""Issue 27: a PySpark job file is a plan for ``theseus run``, ``check --query`` and
``migrate start``, through the real importer (fixtures/pyspark/filter_project: one small
topic, seven records), and the store records the job file's digest with the plan."""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from migrate.cli import main

ROOT = Path(__file__).resolve().parents[2]
CASE = ROOT / "fixtures" / "pyspark" / "filter_project"

pytestmark = pytest.mark.integration


def cli(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture
def job_env(kafka, tmp_path, monkeypatch):
    """The job file copied out (to be edited), its input topic made and filled under a
    fresh prefix; returns the copy, the store and the output topic."""
    from confluent_kafka.admin import NewTopic

    prefix = f"it-jobrun-{uuid.uuid4().hex[:8]}-"
    monkeypatch.setenv("TOPIC_PREFIX", prefix)
    monkeypatch.setenv("KAFKA_BOOTSTRAP", kafka.bootstrap)
    orders = prefix + "orders"
    kafka.admin.create_topics([NewTopic(orders, 3, 1)])[orders].result(30)
    kafka.created.append(orders)
    kafka.produce(orders, [r["value"] for r in json.loads(
        (CASE / "input.json").read_text())["orders"]])
    kafka.created.append(prefix + "big_orders")  # created by theseus run, deleted after
    job = tmp_path / "jobs" / "big_orders.py"
    job.parent.mkdir()
    shutil.copy(CASE / "job.py", job)
    return job, tmp_path / "state", prefix + "big_orders"


def test_run_of_a_job_records_its_digest_and_check_query_reads_it(job_env, kafka,
                                                                  kafka_connector):
    job, state, out = job_env
    r = cli("run", job, "--bootstrap", kafka.bootstrap, "--state", state, "--available-now")
    assert r.exit_code == 0, r.output
    # the plan the job built ran: the orders worth more than 100 outside region 'test'
    assert sorted(rec.json()["order_id"] for rec in kafka.read_all(out)) == ["o2", "o4", "o5"]

    r = cli("status", "--state", state, "--format", "json")
    assert r.exit_code == 0, r.output
    (q,) = json.loads(r.output)["queries"]
    digest = "sha256:" + hashlib.sha256(job.read_bytes()).hexdigest()
    assert (q["plan"]["file"], q["plan"]["source_digest"], q["plan"]["source_changed"]) == \
        (str(job), digest, False)

    # the job as it runs, checked against its checkpoint and recorded plan: the same plan
    r = cli("check", "--query", q["query"], "--state", state, job, "--format", "json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    assert report["verdict"] == "identical" and not report["checkpoint"]["drift"], r.output

    # edited: status says the file changed since it started, and the check of the edit
    # against the checkpoint says what it changes
    job.write_text(job.read_text().replace(
        'F.struct("order_id", "total", "region")',
        'F.struct("order_id", "total", "region", (F.col("total") * 2).alias("twice"))'))
    r = cli("status", "--state", state)
    assert f"(from file {digest[:19]}, changed since)" in r.output, r.output
    r = cli("check", "--query", q["query"], "--state", state, job)
    assert r.exit_code == 0 and "verdict: in_place" in r.output, r.output
    assert "output-column-added" in r.output, r.output


def theseus(*args, timeout: float = 400):
    """The command in its own process (its own JVM, as a user runs it)."""
    import os
    import subprocess
    import sys

    from tests.integration.conftest import spark_env

    return subprocess.run([sys.executable, "-m", "migrate.cli", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          env={**spark_env(), "PYTHONPATH": os.pathsep.join(
                              filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})


@pytest.mark.own_jvm
def test_migrate_start_to_an_edited_job_through_the_importer(job_env, kafka):
    """``migrate start JOB.py`` after an edit (in place: the query was run to the end and
    stopped): the edited job is imported, the migration records its digest, and the query
    restarts on its checkpoint with the plan the job built.  Every command in its own process: the
    migrator's JVM and the host it starts are the only ones."""
    job, state, out = job_env
    r = theseus("run", job, "--bootstrap", kafka.bootstrap, "--state", state,
                "--available-now")
    assert r.returncode == 0, r.stdout + r.stderr
    # edited where it is (the job's query is named after its file): the file the query
    # started from now says something else
    new = job
    new.write_text(job.read_text().replace(
        'F.struct("order_id", "total", "region")',
        'F.struct("order_id", "total", "region", (F.col("total") * 2).alias("twice"))'))
    r = theseus("migrate", "start", new, "--bootstrap", kafka.bootstrap, "--state", state,
                "--strategy", "in-place", "--timeout", "300", "--format", "json")
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        doc = json.loads(r.stdout)
        assert (doc["phase"], doc["path"]) == ("done", "in_place"), r.stdout
        rec = json.loads((state / "migrations" / f"{doc['migration']}.json").read_text())
        assert rec["plan_file"] == str(new)
        assert rec["plan_digest"] == "sha256:" + hashlib.sha256(new.read_bytes()).hexdigest()
        r = theseus("status", "--state", state, "--format", "json", timeout=60)
        (q,) = json.loads(r.stdout)["queries"]
        assert q["plan"]["file"] == str(new) and q["plan"]["source_changed"] is False
        assert "twice" in Path(q["plan"]["recorded"]).read_text()
    finally:
        for name in (p.name for p in (state / "queries").iterdir()):
            theseus("stop", name, "--state", state, "--timeout", "120", timeout=180)
