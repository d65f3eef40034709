"""The job import cache (``migrate.adopt.cache``): keyed by content, never stale, safe to
delete or corrupt.  No Spark here: the import itself is replaced by a fake that counts its
calls and reports the local modules it loaded, as ``run_job`` does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import migrate.adopt as adopt
from migrate.adopt import cache
from migrate.adopt.job import Job
from tests.conftest import FIXTURES

PLAN = json.loads((FIXTURES / "pyspark" / "dedup_watermark" / "plan.json").read_text())
JOB = (FIXTURES / "pyspark" / "dedup_watermark" / "job.py").read_text()


@pytest.fixture
def job(tmp_path, monkeypatch):
    """A job folder (the fixture job and its sibling ``schemas.py``), a cache of its own,
    and a fake import that records what it was asked."""
    monkeypatch.setenv("THESEUS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("THESEUS_IMPORT_CACHE", raising=False)
    folder = tmp_path / "jobs"
    folder.mkdir()
    (folder / "job.py").write_text(JOB)
    (folder / "schemas.py").write_text('EVENT = "event_id STRING, kind STRING, ts TIMESTAMP"\n')
    calls: list[str] = []

    def fake_run(path: str, function: str = "build") -> Job:
        calls.append(path)
        # the plan follows the helper's text, as a real import would
        kind = "kind STRING" in (folder / "schemas.py").read_text()
        return Job(path, function, Path(path).read_text(), {"kind": kind}, None, 2,
                   [str((folder / "schemas.py").resolve())])

    def fake_translate(job: Job, **kw: object) -> dict:
        doc = json.loads(json.dumps(PLAN))
        doc["metadata"] = {"kind_read": job.writer["kind"]}
        job.lookups.append({"node": doc["nodes"][0]["id"], "bootstrap": "b:1",
                            "topic": doc["nodes"][0]["topic"]})
        doc["nodes"][0]["partitions"] = adopt.topic_partitions("b:1", "t")
        return doc

    monkeypatch.setattr(adopt, "run_job", fake_run)
    monkeypatch.setattr(adopt, "translate_job", fake_translate)
    monkeypatch.setattr(adopt, "topic_partitions", lambda b, t: 7)
    return folder, calls


def entries(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "cache" / "imports").rglob("*.json"))


def test_a_job_is_imported_once_per_content(job, tmp_path, monkeypatch):
    folder, calls = job
    first = adopt.import_job(str(folder / "job.py"))
    again = adopt.import_job(str(folder / "job.py"))
    assert calls == [str(folder / "job.py")]
    assert again == first
    # the partitions the broker gave are asked again on a hit, not kept
    monkeypatch.setattr(adopt, "topic_partitions", lambda b, t: 9)
    assert adopt.import_job(str(folder / "job.py"))["nodes"][0]["partitions"] == 9
    assert len(calls) == 1


def test_an_edited_helper_is_a_miss_and_the_new_plan_is_seen(job, tmp_path):
    folder, calls = job
    assert adopt.import_job(str(folder / "job.py"))["metadata"] == {"kind_read": True}
    (folder / "schemas.py").write_text('EVENT = "event_id STRING, ts TIMESTAMP"\n')
    assert adopt.import_job(str(folder / "job.py"))["metadata"] == {"kind_read": False}
    assert len(calls) == 2
    # both revisions of the helper keep their entry: going back is a hit
    (folder / "schemas.py").write_text('EVENT = "event_id STRING, kind STRING, ts TIMESTAMP"\n')
    assert adopt.import_job(str(folder / "job.py"))["metadata"] == {"kind_read": True}
    assert len(calls) == 2
    assert len(entries(tmp_path)) == 2


def test_the_same_job_checked_out_elsewhere_hits(job, tmp_path):
    """--against imports the ref's side from a temporary worktree: module paths are kept
    relative to the job's folder."""
    folder, calls = job
    adopt.import_job(str(folder / "job.py"))
    other = tmp_path / "elsewhere" / "jobs"
    other.mkdir(parents=True)
    for f in ("job.py", "schemas.py"):
        (other / f).write_bytes((folder / f).read_bytes())
    adopt.import_job(str(other / "job.py"))
    assert len(calls) == 1
    (other / "schemas.py").unlink()
    adopt.import_job(str(other / "job.py"))
    assert len(calls) == 2


def test_key_holds_job_bytes_name_function_options_versions_and_env(monkeypatch):
    monkeypatch.delenv("TOPIC_PREFIX", raising=False)
    base = cache.job_key(JOB.encode(), "build", {"name": "job.py"})
    assert cache.job_key(JOB.encode(), "build", {"name": "job.py"}) == base
    assert cache.job_key(JOB.encode() + b"\n", "build", {"name": "job.py"}) != base
    assert cache.job_key(JOB.encode(), "other", {"name": "job.py"}) != base
    assert cache.job_key(JOB.encode(), "build", {"name": "j2.py"}) != base
    assert cache.job_key(JOB.encode(), "build", {"name": "job.py", "partitions": 3}) != base
    # the job reads TOPIC_PREFIX: its value is part of the plan
    monkeypatch.setenv("TOPIC_PREFIX", "t_")
    assert cache.job_key(JOB.encode(), "build", {"name": "job.py"}) != base
    monkeypatch.setattr(cache, "_TOOL", None)
    monkeypatch.setattr(cache, "_version",
                        lambda d: "9.9.9" if d == "pyspark" else "0.1.0")
    monkeypatch.delenv("TOPIC_PREFIX")
    assert cache.job_key(JOB.encode(), "build", {"name": "job.py"}) != base
    monkeypatch.setattr(cache, "_TOOL", None)


def test_key_holds_the_sources_of_compat_the_translation_goes_through(monkeypatch, tmp_path):
    # the plan model, inference and serde shape an import's document as much as the
    # importer does: a checkout edited there must miss the cache, not serve a stale plan
    names = {str(f.relative_to(cache._COMPAT.parent)) for f in cache.tool_files()
             if cache._COMPAT in f.parents}
    assert {"compat/model.py", "compat/infer.py", "compat/serde.py"} <= names
    assert any(n.startswith("compat/schemas/") and n.endswith(".json") for n in names)
    fake = tmp_path / "compat"
    (fake / "steps").mkdir(parents=True)
    (fake / "model.py").write_text("A = 1\n")
    (fake / "steps" / "join.py").write_text("B = 1\n")
    monkeypatch.setattr(cache, "_COMPAT", fake)
    monkeypatch.setattr(cache, "_TOOL", None)
    base = cache.job_key(JOB.encode(), "build", {"name": "job.py"})
    (fake / "steps" / "join.py").write_text("B = 2\n")
    monkeypatch.setattr(cache, "_TOOL", None)
    assert cache.job_key(JOB.encode(), "build", {"name": "job.py"}) != base
    (fake / "steps" / "join.py").write_text("B = 1\n")
    monkeypatch.setattr(cache, "_TOOL", None)
    assert cache.job_key(JOB.encode(), "build", {"name": "job.py"}) == base
    monkeypatch.setattr(cache, "_TOOL", None)


def test_env_names_are_read_from_the_text():
    text = b'os.environ.get("A", "x") + os.getenv(\'B\') + os.environ["C"] + environ.get(D)'
    assert cache.env_names(text) == ["A", "B", "C"]


@pytest.mark.parametrize("garbage", [b"", b"{", b"\xff\xfe", b"[]", b'{"layout": 1}',
                                     b'{"layout": 1, "modules": {}, "env": {}, '
                                     b'"lookups": [], "doc": {"nodes": "x"}}'])
def test_a_corrupt_entry_is_ignored_and_rewritten(job, tmp_path, garbage):
    folder, calls = job
    adopt.import_job(str(folder / "job.py"))
    (entry,) = entries(tmp_path)
    entry.write_bytes(garbage)
    doc = adopt.import_job(str(folder / "job.py"))
    assert len(calls) == 2
    assert doc["nodes"][0]["partitions"] == 7
    assert json.loads(entry.read_text())["doc"]["query"] == PLAN["query"]
    adopt.import_job(str(folder / "job.py"))
    assert len(calls) == 2


def test_a_deleted_cache_and_a_partial_write_are_misses(job, tmp_path):
    import shutil

    folder, calls = job
    adopt.import_job(str(folder / "job.py"))
    shutil.rmtree(tmp_path / "cache")
    adopt.import_job(str(folder / "job.py"))
    assert len(calls) == 2
    # a writer killed before its rename leaves a temporary file, never read as an entry
    (entry,) = entries(tmp_path)
    (entry.parent / ".tmp-x.json").write_text('{"layout": 1, "modu')
    entry.unlink()
    adopt.import_job(str(folder / "job.py"))
    assert len(calls) == 3


def test_an_unwritable_cache_is_no_error(job, tmp_path, monkeypatch):
    folder, calls = job
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("THESEUS_CACHE_DIR", str(tmp_path / "file" / "sub"))
    adopt.import_job(str(folder / "job.py"))
    adopt.import_job(str(folder / "job.py"))
    assert len(calls) == 2


def test_cache_can_be_turned_off(job, monkeypatch):
    folder, calls = job
    monkeypatch.setenv("THESEUS_IMPORT_CACHE", "0")
    adopt.import_job(str(folder / "job.py"))
    adopt.import_job(str(folder / "job.py"))
    assert len(calls) == 2


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("THESEUS_CACHE_DIR", str(tmp_path / "own"))
    assert cache.cache_dir() == tmp_path / "own"
    monkeypatch.delenv("THESEUS_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "theseus"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.cache_dir() == tmp_path / "home" / ".cache" / "theseus"
