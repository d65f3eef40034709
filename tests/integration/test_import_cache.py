"""The job import cache on real Spark: a job is run under Spark once per content, an edited
helper module is seen at once, and every import of the process shares one Spark session."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import migrate.adopt as adopt

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "fixtures" / "pyspark" / "dedup_watermark"

pytestmark = pytest.mark.integration


def test_a_job_imports_once_per_content_and_sees_its_edited_helper(
        kafka_connector, tmp_path, monkeypatch):
    monkeypatch.setenv("THESEUS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("THESEUS_IMPORT_CACHE", raising=False)
    monkeypatch.delenv("TOPIC_PREFIX", raising=False)
    folder = tmp_path / "jobs"
    shutil.copytree(JOB, folder)
    runs: list = []
    real = adopt.run_job

    def counted(path: str, function: str = "build"):
        job = real(path, function)
        runs.append(job)
        return job

    monkeypatch.setattr(adopt, "run_job", counted)
    target = str(folder / "job.py")

    def schema() -> list[str]:
        doc = adopt.import_job(target, partitions=1)
        (src,) = [n for n in doc["nodes"] if n["step"] == "source"]
        return [c["name"] for c in src["schema"]]

    assert schema() == ["event_id", "kind", "ts"]
    assert schema() == ["event_id", "kind", "ts"]
    assert len(runs) == 1
    # the helper's file is what the import recorded: the sys.modules difference
    assert runs[0].modules == [str((folder / "schemas.py").resolve())]

    (folder / "schemas.py").write_text(
        'EVENT = "event_id STRING, kind STRING, ts TIMESTAMP, region STRING"\n')
    assert schema() == ["event_id", "kind", "ts", "region"]
    assert len(runs) == 2
    # another job, then the first again: one session for every import of the process
    other = ROOT / "fixtures" / "pyspark" / "filter_project" / "job.py"
    adopt.import_job(str(other), partitions=1)
    (folder / "job.py").write_text((folder / "job.py").read_text() + "\n# edited\n")
    assert schema() == ["event_id", "kind", "ts", "region"]
    assert len(runs) == 4
    assert len({id(j.spark) for j in runs}) == 1
    assert runs[0].spark is kafka_connector or runs[0].spark.sparkContext is \
        kafka_connector.sparkContext
