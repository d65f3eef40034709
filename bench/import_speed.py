"""Benchmark: ``theseus check --against HEAD`` and ``theseus fleet check --against HEAD`` on a
generated git repository of 200 PySpark job files.

The jobs are the shapes of ``fixtures/pyspark/*/job.py`` in turn (filter and projection,
windows, joins, deduplication...), chained through topics: job *k*'s first source reads
what the latest job before it writes whose output it can read (every column the source
declares written, in its type: a fleet whose contracts hold), else the shape's own input
topic; job *k* writes ``jNNN_out``.  They sit in one folder with the
``schemas.py`` helper the deduplication shape imports.  Each case runs the real command in
a process of its own (Python start-up included), timed by the wall clock:

1. nothing changed (an empty import cache: nothing needs importing);
2. two jobs changed (a filter's threshold), on an empty cache: Spark starts, both sides of
   both jobs are imported;
3. the same two changes again, with the cache the run before filled.

The jobs name their broker (``$KAFKA_BOOTSTRAP``, 127.0.0.1:19092 by default): an import
asks it for each source's partition count, a cache hit asks again.  Run it while no other
Spark runs (``flock /tmp/theseus-spark.lock make bench-import``); writes
``bench/results/import.md``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "fixtures" / "pyspark"
JOBS = 200
CHANGED = 2
#: the jobs that read another job's output
CHAINED: list[int] = []
#: the targets of issue 27 (seconds)
TARGETS = {"nothing changed": 3.0, "2 changed, cold cache": 40.0,
           "2 changed, warm cache": 5.0}
_SUBSCRIBE = re.compile(r'(\.option\("subscribe", prefix \+ )"([^"]+)"')
# (one fixture, stream_join, writes the prefix out in full)
_TOPIC = re.compile(r'(\.option\("topic", (?:prefix|os\.environ\.get\("TOPIC_PREFIX", ""\)) \+ )'
                    r'"([^"]+)"')


def shapes() -> list[tuple[str, str]]:
    return [(p.parent.name, p.read_text()) for p in sorted(FIX.glob("*/job.py"))]


def readers() -> dict[str, set[str]]:
    """For each shape, the shapes whose first source can read its output, from the plans
    the fixtures' jobs import to (``fixtures/pyspark/<shape>/plan.json``)."""
    sys.path.insert(0, str(ROOT))
    from compat.infer import analyze
    from compat.serde import from_doc

    outs, ins = {}, {}
    for shape, _ in shapes():
        doc = json.loads((FIX / shape / "plan.json").read_text())
        plan = from_doc(doc, shape)
        analyze(plan)
        outs[shape] = dict(plan.info[plan.sink_id].columns)
        src = next(n for n in doc["nodes"] if n["step"] == "source")
        ins[shape] = {c["name"].lower(): c["type"] for c in src["schema"]}
    return {a: {b for b in ins if all(outs[a].get(c) == typ for c, typ in ins[b].items())}
            for a in outs}


def generate(repo: Path) -> list[str]:
    """The repository's jobs (committed); the names of the jobs the changed cases edit."""
    jobs = repo / "jobs"
    jobs.mkdir(parents=True)
    shutil.copy(FIX / "dedup_watermark" / "schemas.py", jobs / "schemas.py")
    editable = []
    all_shapes = shapes()
    can_read = readers()
    made: list[str] = []
    for k in range(JOBS):
        shape, text = all_shapes[k % len(all_shapes)]
        producer = next((j for j in range(k - 1, -1, -1) if shape in can_read[made[j]]),
                        None)
        made.append(shape)
        if producer is not None:
            text = _SUBSCRIBE.sub(lambda m, j=producer: f'{m.group(1)}"j{j:03d}_out"', text,
                                  count=1)
            CHAINED.append(k)
        text = _TOPIC.sub(lambda m, k=k: f'{m.group(1)}"j{k:03d}_out"', text)
        name = f"job_{k:03d}_{shape}.py"
        (jobs / name).write_text(text)
        if shape == "filter_project":
            editable.append(name)
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "bench@example.com")
    git(repo, "config", "user.name", "bench")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "200 jobs")
    return editable[:CHANGED]


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def theseus(repo: Path, cache: Path, *args: str) -> tuple[float, int, str]:
    env = dict(os.environ, THESEUS_CACHE_DIR=str(cache),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("KAFKA_BOOTSTRAP", "127.0.0.1:19092")
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    env.pop("TOPIC_PREFIX", None)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "migrate.cli", *args], cwd=repo, env=env,
                       capture_output=True, text=True)
    took = time.perf_counter() - t0
    out = (r.stdout.strip() or r.stderr.strip()).splitlines()
    return took, r.returncode, (out[0] if out else "")[:160]


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="theseus-bench-import-"))
    rows: list[tuple[str, str, float, int, str]] = []
    try:
        repo = tmp / "repo"
        edited = generate(repo)
        for cmd in (["check", "--against", "HEAD", "jobs"],
                    ["fleet", "check", "--against", "HEAD", "jobs"]):
            what = " ".join(cmd)
            cold, warm = tmp / f"cache-{cmd[0]}-cold", tmp / f"cache-{cmd[0]}-warm"
            git(repo, "checkout", "-q", "--", ".")
            rows.append((what, "nothing changed", *theseus(repo, tmp / "empty", *cmd)))
            for name in edited:
                p = repo / "jobs" / name
                p.write_text(p.read_text().replace("> 100", "> 150", 1))
            rows.append((what, "2 changed, cold cache", *theseus(repo, cold, *cmd)))
            if cold.is_dir():  # a command that imported nothing filled no cache
                shutil.copytree(cold, warm, dirs_exist_ok=True)
            rows.append((what, "2 changed, warm cache", *theseus(repo, warm, *cmd)))
            shutil.rmtree(tmp / "empty", ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    write(rows, edited)


def write(rows: list[tuple[str, str, float, int, str]], edited: list[str]) -> None:
    lines = ["# Job file imports: `check --against` and `fleet check --against`", "",
             f"Generated by `make bench-import` (`bench/import_speed.py`) on "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores: "
             f"a git repository of {JOBS} PySpark job files (the {len(shapes())} shapes of "
             f"`fixtures/pyspark/` in turn, {len(CHAINED)} of them reading another job's "
             "output topic, one `schemas.py` helper), "
             f"{CHANGED} of them changed ({', '.join(f'`{e}`' for e in edited)}: a filter's "
             "threshold). Wall-clock seconds of the whole command in its own process.", "",
             "| command | case | target | seconds | within | exit | first line of output |",
             "|---|---|---|---|---|---|---|"]
    for what, case, took, code, first in rows:
        target = TARGETS[case]
        # a command that refused the folder measured nothing
        ok = "— (error)" if code == 2 else "yes" if took <= target else "**no**"
        first = first.replace("|", "\\|")
        lines.append(f"| `theseus {what}` | {case} | ≤ {target:g} s | {took:.1f} | {ok} | "
                     f"{code} | {first} |")
    if any(code == 2 for *_, code, _ in rows):
        lines += ["", "A command that exits 2 refused the folder: nothing was measured "
                  "(`fleet check` reads job files once issue 27 item 1 is in)."]
    lines += ["", "Cold: an empty import cache (`THESEUS_CACHE_DIR` fresh), so the process "
              "starts Spark and imports both sides of each changed job (`fleet check`: every "
              "job of the work tree too, since a fleet needs every query's topics). Warm: the "
              "cache the cold run filled; no Spark starts. Nothing changed: no job is "
              "imported (`fleet check` reads no plan at all).", ""]
    out = ROOT / "bench" / "results" / "import.md"
    out.write_text("\n".join(lines))
    print(out.read_text())


if __name__ == "__main__":
    main()
