"""``theseus plan import`` on real Spark (no Kafka needed: nothing is started).

* every job under fixtures/pyspark/ imports to its expected plan;
* bad input (a file raising on import, a function returning something else, a source that
  is not Kafka, a UDF, foreachBatch...): one line naming the file (and line), exit 2;
* pairs of job versions get the verdicts of the equivalent hand-written plan pairs;
* ``theseus check OLD.py NEW.py`` and ``check --against REF`` take job files;
* ``plan export --pyspark`` then ``plan import`` gives every exportable fixture plan back.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from compat.check import check_plans, load_plan
from compat.export import exportable, to_pyspark
from compat.serde import from_doc
from migrate.cli import main

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "fixtures" / "pyspark"
CASES = sorted(p for p in FIX.iterdir() if (p / "job.py").exists())
PAIRS = sorted(p for p in (FIX / "upgrades").iterdir() if p.is_dir()) \
    if (FIX / "upgrades").exists() else []

pytestmark = pytest.mark.integration


def _import(target: str, **kw) -> dict:
    from migrate.adopt import import_job

    return import_job(target, **kw)


def _plan_args(doc: dict) -> dict:
    parts = {n["partitions"] for n in doc["nodes"] if n["step"] == "source"}
    (sink,) = [n for n in doc["nodes"] if n["step"] == "sink"]
    assert len(parts) == 1
    return {"partitions": parts.pop(), "delivery": sink["delivery"]}


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_job_imports_to_its_expected_plan(case, kafka_connector, monkeypatch):
    monkeypatch.delenv("TOPIC_PREFIX", raising=False)
    monkeypatch.setenv("KAFKA_BOOTSTRAP", "127.0.0.1:1")  # no broker: partitions from flag
    expected = json.loads((case / "plan.json").read_text())
    got = _import(str(case / "job.py"), **_plan_args(expected))
    got.pop("metadata")
    expected.pop("metadata", None)
    # Every node says where it was made, in a file of the job's folder (the lines are
    # tests/integration/test_pyspark_origins.py's); the plan is compared without them.
    lines = {p.name: len(p.read_text().splitlines()) for p in case.glob("*.py")}
    for n in got["nodes"]:
        origin = n.pop("x-origin")
        assert 1 <= origin["line"] <= lines[origin["file"]], (n["id"], origin)
    assert got == expected


def _cli(*args: str):
    return CliRunner().invoke(main, list(args))


BAD = {
    "raises.py": ("import os\nraise RuntimeError('no config')\n",
                  "raises.py:2: the job file raised on import: RuntimeError: no config"),
    "returns_df.py": ("def build(spark):\n    return spark.range(3)\n",
                      "does not return a DataStreamWriter"),
    "no_build.py": ("def make(spark):\n    pass\n", "has no function 'build'"),
    "rate.py": ("def build(spark):\n"
                "    df = spark.readStream.format('rate').load()\n"
                "    return df.selectExpr('CAST(value AS STRING) AS value')"
                ".writeStream.format('kafka').option('topic', 'x')\n",
                "the source is not Kafka: readStream.format('rate')"),
}

_KAFKA = ("from pyspark.sql import functions as F\n"
          "def src(spark):\n"
          "    return (spark.readStream.format('kafka').option('subscribe', 't')"
          ".option('kafka.bootstrap.servers', 'x:1').load()\n"
          "            .select(F.from_json(F.col('value').cast('string'), 'a INT, b STRING')"
          ".alias('d')).select('d.*'))\n")

REFUSED = {
    "udf.py": (_KAFKA + "@F.udf('string')\n"
               "def shout(s):\n    return s.upper()\n"
               "def build(spark):\n"
               "    df = src(spark).select(shout('b').alias('b'))\n"
               "    return df.select(F.to_json(F.struct('b')).alias('value'))"
               ".writeStream.format('kafka').option('topic', 'o')\n",
               "udf.py:6: a Python UDF 'shout' cannot be expressed in a plan"),
    "foreach_batch.py": (_KAFKA + "def build(spark):\n"
                         "    return src(spark).writeStream.foreachBatch(lambda d, i: None)\n",
                         "foreach_batch.py:6: 'foreachBatch' cannot be expressed in a plan"),
    "pandas_state.py": (_KAFKA + "def build(spark):\n"
                        "    out = src(spark).groupBy('b').applyInPandasWithState(\n"
                        "        lambda k, p, s: p, 'b STRING', 'n INT', 'append', 'NoTimeout')\n"
                        "    return out.select(F.to_json(F.struct('b')).alias('value'))"
                        ".writeStream.format('kafka').option('topic', 'o')\n",
                        "pandas_state.py:6: 'applyInPandasWithState' cannot be expressed"),
    "reflect.py": (_KAFKA + "def build(spark):\n"
                   "    df = src(spark).selectExpr(\"reflect('java.util.UUID', 'randomUUID') "
                   "AS b\")\n"
                   "    return df.select(F.to_json(F.struct('b')).alias('value'))"
                   ".writeStream.format('kafka').option('topic', 'o')\n",
                   "arbitrary Java (reflect/java_method) cannot be expressed in a plan"),
    "record_timestamp.py": ("from pyspark.sql import functions as F\n"
                            "def build(spark):\n"
                            "    df = spark.readStream.format('kafka').option('subscribe', "
                            "'t').option('kafka.bootstrap.servers', 'x:1').load()\n"
                            "    df = df.selectExpr('CAST(value AS STRING) AS v', "
                            "'timestamp')\n"
                            "    return df.select(F.to_json(F.struct('v')).alias('value'))"
                            ".writeStream.format('kafka').option('topic', 'o')\n",
                            "the Kafka record's timestamp"),
    "static_every_record.py": (_KAFKA + "def build(spark):\n"
                               "    t = spark.read.format('kafka').option('subscribe', 'c')"
                               ".option('kafka.bootstrap.servers', 'x:1').load()\n"
                               "    t = t.select(F.from_json(F.col('value').cast('string'), "
                               "'a INT, n STRING').alias('d')).select('d.*')\n"
                               "    df = src(spark).join(t, 'a')\n"
                               "    return df.select(F.to_json(F.struct('n')).alias('value'))"
                               ".writeStream.format('kafka').option('topic', 'o')\n",
                               "static_every_record.py:6: a batch read (spark.read) cannot "
                               "be expressed in a plan but as a table"),
    "static_latest_by_time.py": (_KAFKA + "from pyspark.sql import Window\n"
                                 "def build(spark):\n"
                                 "    t = spark.read.format('kafka').option('subscribe', 'c')"
                                 ".option('kafka.bootstrap.servers', 'x:1').load()\n"
                                 "    w = Window.partitionBy('key').orderBy("
                                 "F.col('timestamp').desc())\n"
                                 "    t = t.withColumn('rn', F.row_number().over(w))"
                                 ".where('rn = 1 AND value IS NOT NULL')\n"
                                 "    t = t.select(F.from_json(F.col('value').cast('string'), "
                                 "'a INT, n STRING').alias('d')).select('d.*')\n"
                                 "    df = src(spark).join(t, 'a')\n"
                                 "    return df.select(F.to_json(F.struct('n')).alias('value'))"
                                 ".writeStream.format('kafka').option('topic', 'o')\n",
                                 "static_latest_by_time.py:9: a table read must keep the "
                                 "latest record per key as a plan's table does: orderBy the "
                                 "record's offset"),
}


@pytest.mark.parametrize("name", sorted(BAD) + sorted(REFUSED))
def test_bad_jobs_are_one_line_exit_2(name, kafka_connector, tmp_path, monkeypatch):
    text, message = {**BAD, **REFUSED}[name]
    monkeypatch.chdir(tmp_path)
    (tmp_path / name).write_text(text)
    r = _cli("plan", "import", name, "--partitions", "1")
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1, r.output
    assert message in lines[0], lines[0]
    assert lines[0].startswith(f"theseus: error: {name}")


def test_a_missing_job_file_is_one_line(kafka_connector, tmp_path):
    r = _cli("plan", "import", str(tmp_path / "nope.py"))
    assert r.exit_code == 2 and "file not found" in r.output


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: p.name)
def test_job_pairs_get_the_verdicts_of_the_plan_pairs(pair, kafka_connector, monkeypatch):
    monkeypatch.setenv("KAFKA_BOOTSTRAP", "127.0.0.1:1")
    expect = json.loads((pair / "expect.json").read_text())
    by_plans = check_plans(load_plan(str(pair / "old.json")), load_plan(str(pair / "new.json")))
    r = _cli("check", str(pair / "old.py"), str(pair / "new.py"), "--format", "json")
    by_jobs = json.loads(r.output)
    assert by_plans.verdict == expect["verdict"]
    assert by_jobs["verdict"] == expect["verdict"], r.output
    assert r.exit_code == {"identical": 0, "in_place": 0, "migrate": 1,
                           "unsupported": 3}[expect["verdict"]]
    codes = {f["code"] for f in by_jobs["findings"]}
    assert set(expect.get("codes", [])) <= codes, codes
    assert {f.code for f in by_plans.findings} >= set(expect.get("codes", []))


def test_check_against_imports_the_ref_from_its_own_tree(kafka_connector, tmp_path,
                                                         monkeypatch):
    """A job and its sibling module both change; --against REF must import the old job
    with the old sibling (not today's)."""
    repo = tmp_path / "repo"
    jobs = repo / "jobs"
    jobs.mkdir(parents=True)

    def git(*a):
        subprocess.run(["git", *a], cwd=repo, check=True, capture_output=True)

    job = textwrap.dedent("""\
        from pyspark.sql import functions as F
        from settings import GROUP

        def build(spark):
            df = (spark.readStream.format("kafka").option("subscribe", "orders")
                  .option("kafka.bootstrap.servers", "127.0.0.1:1").load()
                  .select(F.from_json(F.col("value").cast("string"),
                                      "region STRING, shop STRING, amount DOUBLE").alias("o"))
                  .select("o.*"))
            agg = df.groupBy(GROUP).agg(F.sum("amount").alias("total"))
            return (agg.select(F.to_json(F.struct(GROUP)).alias("key"),
                               F.to_json(F.struct(GROUP, "total")).alias("value"))
                    .writeStream.format("kafka").option("topic", "totals")
                    .outputMode("update"))
        """)
    (jobs / "totals.py").write_text(job)
    (jobs / "settings.py").write_text('GROUP = "region"\n')
    git("init", "-q")
    git("-c", "user.email=t@t", "-c", "user.name=t", "add", ".")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "v1")
    monkeypatch.chdir(repo)
    monkeypatch.setenv("KAFKA_BOOTSTRAP", "127.0.0.1:1")
    r = _cli("check", "--against", "HEAD", "jobs", "--format", "json")
    doc = json.loads(r.output)
    assert r.exit_code == 0 and doc["summary"]["identical"] == 1, r.output
    (jobs / "settings.py").write_text('GROUP = "shop"\n')  # the grouping key changes
    r = _cli("check", "--against", "HEAD", "jobs", "--format", "json")
    doc = json.loads(r.output)
    assert [f["outcome"] for f in doc["files"]] == ["unsupported"], r.output
    codes = {f["code"] for f in doc["files"][0]["report"]["findings"]}
    assert "aggregate-key-changed" in codes, codes
    listed = subprocess.run(["git", "worktree", "list"], cwd=repo, capture_output=True,
                            text=True).stdout
    assert len(listed.strip().splitlines()) == 1, listed  # the temporary tree is gone


def _export_cases():
    out = []
    for p in sorted((ROOT / "fixtures").rglob("*.json")):
        if p.name not in ("plan.json", "old.json", "new.json") or "fleets" in p.parts:
            continue
        if p.parent.parent.name == "avro":
            # the Avro check cases have no config (a job sets 200 shuffle partitions) and
            # identity projections (an import drops them): not what a round trip proves;
            # test_avro_import round-trips fixtures/pyspark_avro
            continue
        try:
            plan = load_plan(str(p))
        except Exception:
            continue
        if exportable(plan) is None:
            out.append(p)
    return out


EXPORTABLE = _export_cases()


@pytest.fixture
def registry_stand_in(monkeypatch):
    """An Avro output's job asks a registry for its schema's id when it is built: the
    stand-in of tests/test_avro_wire answers."""
    import threading
    from http.server import ThreadingHTTPServer

    from tests.test_avro_wire import FakeRegistry

    FakeRegistry.schemas, FakeRegistry.subjects = {}, {}
    srv = ThreadingHTTPServer(("127.0.0.1", 0), FakeRegistry)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setenv("SCHEMA_REGISTRY_URL", f"http://127.0.0.1:{srv.server_address[1]}")
    yield
    srv.shutdown()
    srv.server_close()


def test_export_round_trip_over_every_exportable_fixture_plan(kafka_connector, tmp_path,
                                                              monkeypatch, registry_stand_in):
    monkeypatch.setenv("KAFKA_BOOTSTRAP", "127.0.0.1:1")
    assert len(EXPORTABLE) >= 20
    failures = []
    for i, path in enumerate(EXPORTABLE):
        plan = load_plan(str(path))
        job = tmp_path / f"job{i}.py"
        job.write_text(to_pyspark(plan))
        parts = {n.topic: n.partitions for n in plan.nodes.values() if n.step == "source"}
        doc = _import(str(job), partitions=max(parts.values()), delivery=plan.sink.delivery)
        for n in doc["nodes"]:
            if n["step"] == "source":
                n["partitions"] = parts[n["topic"]]
        back = from_doc(doc, str(job))
        report = check_plans(plan, back)
        if report.verdict != "identical":
            failures.append(f"{path.relative_to(ROOT)}: {report.verdict} "
                            f"{[f.message for f in report.findings][:3]}")
    assert not failures, "\n".join(failures)


@pytest.mark.own_jvm
def test_the_command_prints_one_line_and_a_plan(tmp_path):
    """As users run it, in its own process: the JVM's start-up chatter stays out of the
    terminal; a bad job is one line on stderr (exit 2), a good one a plan on stdout."""
    from tests.integration.conftest import PYTHON, ROOT, spark_env

    bad = tmp_path / "bad.py"
    bad.write_text(REFUSED["foreach_batch.py"][0])
    env = {**spark_env(), "PYTHONPATH": str(ROOT)}
    r = subprocess.run([PYTHON, "-m", "migrate.cli", "plan", "import", str(bad)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"theseus: error: {bad}:6: 'foreachBatch' cannot be expressed in a plan: it runs "
        "arbitrary code on each batch (expected writeStream.format('kafka'), found "
        "foreachBatch)"], r.stderr
    out = tmp_path / "plan.json"
    r = subprocess.run([PYTHON, "-m", "migrate.cli", "plan", "import",
                        str(FIX / "stream_join" / "job.py"), "--partitions", "2", "-o",
                        str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    doc = json.loads(out.read_text())
    assert [n["step"] for n in doc["nodes"]] == ["source", "source", "join", "sink"]
