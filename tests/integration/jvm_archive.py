"""A class-data-sharing archive of the Spark driver's classes, for the drivers the tests start.

Every integration test starts Spark drivers in subprocesses (``theseus run``, a migration's
shadows), up to six at a time, and the machine has two cores: a driver JVM spends ~16 CPU
seconds starting (loading and verifying ~15,000 classes of Spark's jars) even with the client
compiler alone (``TEST_DRIVER_JAVA_OPTIONS``). A dynamic CDS archive (JDK 13+:
``-XX:ArchiveClassesAtExit`` once, then ``-XX:SharedArchiveFile`` for every later JVM with
the same class path) maps those classes parsed and verified instead: about half of that CPU
goes (``make bench-jvm`` measures it).

The archive is made once per machine and cached under ``.cache/jvm/``, named by what it
depends on (the ``java -version`` text and the jars of the installed PySpark): a JDK or
Spark upgrade makes a new one. It is made by one real ``theseus run --available-now`` of a
stateful plan (source, aggregate on RocksDB, exactly-once update sink), so the classes a
test's queries load are in it. A JVM given an archive that does not fit its class path
ignores it (``-Xshare:auto``) and starts as before.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARCHIVE_DIR = ROOT / ".cache" / "jvm"


def archive_key() -> str:
    """What the archive is valid for: the JDK build and the jars on the driver's class
    path (PySpark's ``jars/``, names and sizes)."""
    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True,
                          timeout=60).stderr
    jars = Path(pyspark.__file__).parent / "jars"
    listing = sorted(f"{p.name}:{p.stat().st_size}" for p in jars.glob("*.jar"))
    h = hashlib.sha256("\n".join([java, str(jars), *listing]).encode())
    return h.hexdigest()[:16]


def archive_path() -> Path:
    return ARCHIVE_DIR / f"spark-driver-{archive_key()}.jsa"


def _plan(query: str, src: str, out: str) -> dict:
    return {"format": "theseus.plan/1", "query": query, "config": {"state_partitions": 2},
            "nodes": [
                {"id": "events", "step": "source", "version": 1, "topic": src,
                 "partitions": 2, "format": "json", "role": "stream",
                 "schema": [{"name": "k", "type": "string"}, {"name": "x", "type": "bigint"}]},
                {"id": "keep", "step": "filter", "version": 1, "inputs": ["events"],
                 "predicate": "x > 0"},
                {"id": "per_key", "step": "aggregate", "version": 1, "inputs": ["keep"],
                 "group_by": [{"name": "k", "expr": "k"}],
                 "aggregates": [{"name": "s", "function": "sum", "args": ["x"]},
                                {"name": "n", "function": "count", "args": ["*"]}]},
                {"id": "out", "step": "sink", "version": 1, "inputs": ["per_key"],
                 "topic": out, "format": "json", "key_columns": ["k"], "mode": "update",
                 "delivery": "exactly_once"}]}


def _session_alive(sid: int) -> bool:
    """Whether a process of session ``sid`` still runs (the driver JVM outlives the Python
    process that started it while it writes the archive)."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            return True
    return False


def make_archive(bootstrap: str, java_options: str, dest: Path, work: Path,
                 timeout: float = 300) -> str | None:
    """Write the archive to ``dest`` by one ``theseus run --available-now`` on ``bootstrap``;
    returns None, or why it could not (the tests then run without it)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    tag = uuid.uuid4().hex[:8]
    src, out = f"it-cds-in-{tag}", f"it-cds-out-{tag}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for t in (src, out):
        admin.create_topics([NewTopic(t, 2, 1)])[t].result(30)
    try:
        p = Producer({"bootstrap.servers": bootstrap})
        for i in range(200):
            p.produce(src, json.dumps({"k": f"k{i % 7}", "x": i}).encode(), partition=i % 2)
        p.flush(30)
        work.mkdir(parents=True, exist_ok=True)
        plan = work / "cds.json"
        plan.write_text(json.dumps(_plan(f"cds_{tag}", src, out)))
        part = dest.with_name(dest.name + f".{os.getpid()}.part")
        env = dict(os.environ, THESEUS_SPARK_CONF=(
            f"spark.driver.extraJavaOptions={java_options} "
            f"-XX:ArchiveClassesAtExit={part} -Xlog:disable -Xlog:all=off"))
        dest.parent.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(
            [sys.executable, "-m", "migrate.cli", "run", str(plan), "--bootstrap", bootstrap,
             "--state", str(work / "state"), "--available-now"], cwd=ROOT, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)
        try:
            log, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            return f"the run that makes it did not end within {timeout:.0f} s"
        deadline = time.monotonic() + 120
        while _session_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        if proc.returncode != 0:
            return f"the run that makes it exited {proc.returncode}: {log[-1500:]}"
        if _session_alive(proc.pid) or not part.exists() or part.stat().st_size == 0:
            part.unlink(missing_ok=True)
            return "the driver JVM wrote no archive"
        part.replace(dest)
        return None
    finally:
        admin.delete_topics([src, out])
