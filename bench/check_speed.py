"""Benchmark: the cost of ``theseus check`` against ``json.load`` of the same two files.

Everything is timed as its own process, the way a CI gate runs it: ``json.load`` of both
files is ``python -c 'import json; json.load(...); json.load(...)'``, the check is
``python -m migrate.cli check old.json new.json`` (what the ``theseus`` entry point runs).
Each figure is the median over a few repeats; the peak memory is the child's ``ru_maxrss``
(read per child with ``os.wait4``).

Figures (issue 11):

* on 20,000-node pairs with 0.1%, 1%, 5% and 20% of the steps changed (filter predicates
  and project expressions, half and half), the check time over ``json.load`` of both files
  (target: at most 3x for every row) and the peak memory, for two plan shapes:

  - ``chain``: what a new user tries first, a long chain of alternating filters and
    projects before and after one aggregate (source -> f/p/f/p... -> aggregate ->
    f/p/f/p... -> sink); changes fall on both sides of the aggregate;
  - ``branchy``: many source branches of filter/project chains unioned into one aggregate;

* how the check time grows with plan size (1k, 5k, 20k, 80k nodes) at 1% changed, both
  shapes: a table and, when matplotlib is installed, a plot;
* a small pair (``fixtures/plans/ship_load.json`` against itself): the whole command over a
  bare interpreter start (target: at most 8x).

Run: ``make bench`` (or ``python bench/check_speed.py``; ``--quick`` for a smoke run).
Figures go to ``bench/results/check_speed.{json,md}``, ``check_speed_growth.csv`` and
``check_speed_growth.png``.  This is a benchmark, never a timed test.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"

REGIONS = ["eu", "us", "apac", "latam", "mea"]
RATES = (0.001, 0.01, 0.05, 0.2)
SIZES = (1_000, 5_000, 20_000, 80_000)
GROWTH_RATE = 0.01
TARGET_RATIO = 3.0
TARGET_SMALL = 8.0


# -- plans ---------------------------------------------------------------------------------

_SCHEMA = [{"name": "user_id", "type": "string"}, {"name": "region", "type": "string"},
           {"name": "amount", "type": "double"}, {"name": "qty", "type": "int"},
           {"name": "ts", "type": "timestamp"}]


def _source(sid: str, topic: str, rng: random.Random) -> dict:
    return {"id": sid, "step": "source", "version": 1, "topic": topic,
            "partitions": rng.choice([3, 6, 12]), "format": "json", "role": "stream",
            "schema": _SCHEMA, "event_time": {"column": "ts", "watermark": "1 minute"}}


class _Steps:
    """Writes filters and projects; the k-th passive step is changed when k is in ``changed``
    (a filter gets another bound, a project another factor)."""

    def __init__(self, rng: random.Random, changed: set[int]) -> None:
        self.rng = rng
        self.changed = changed
        self.k = 0

    def _bump(self) -> int:
        k, self.k = self.k, self.k + 1
        return 1 if k in self.changed else 0

    def filter_rows(self, nid: str, prev: str) -> dict:
        limit = self.rng.randint(1, 10_000)
        region = self.rng.choice(REGIONS)
        limit += self._bump()
        return {"id": nid, "step": "filter", "version": 1, "inputs": [prev],
                "predicate": f"amount > {limit} AND region <> '{region}'"}

    def project_rows(self, nid: str, prev: str) -> dict:
        factor = self.rng.randint(1, 9)
        factor += self._bump()
        return {"id": nid, "step": "project", "version": 1, "inputs": [prev],
                "columns": [{"name": "user_id", "expr": "user_id"},
                            {"name": "region", "expr": "upper(region)"},
                            {"name": "amount", "expr": f"amount * {factor}.5"},
                            {"name": "qty", "expr": "qty"}, {"name": "ts", "expr": "ts"}]}

    def filter_groups(self, nid: str, prev: str) -> dict:
        limit = self.rng.randint(1, 10_000)
        region = self.rng.choice(REGIONS)
        limit += self._bump()
        return {"id": nid, "step": "filter", "version": 1, "inputs": [prev],
                "predicate": f"revenue > {limit} AND region <> '{region}'"}

    def project_groups(self, nid: str, prev: str) -> dict:
        factor = self.rng.randint(1, 9)
        factor += self._bump()
        return {"id": nid, "step": "project", "version": 1, "inputs": [prev],
                "columns": [{"name": "region", "expr": "region"},
                            {"name": "revenue", "expr": f"revenue * {factor}.5"},
                            {"name": "orders", "expr": "orders"}]}


def _aggregate(nid: str, prev: str) -> dict:
    return {"id": nid, "step": "aggregate", "version": 1, "inputs": [prev],
            "group_by": [{"name": "region", "expr": "region"}],
            "aggregates": [{"name": "revenue", "function": "sum", "args": ["amount"]},
                           {"name": "orders", "function": "count", "args": ["*"]}]}


def _sink(prev: str) -> dict:
    return {"id": "out", "step": "sink", "version": 1, "inputs": [prev],
            "topic": "region_totals", "format": "json", "key_columns": ["region"],
            "mode": "update", "delivery": "exactly_once"}


def _plan(nodes: list[dict]) -> dict:
    return {"format": "theseus.plan/1", "query": "big", "config": {"state_partitions": 8},
            "nodes": nodes}


def chain_plan(n_nodes: int, seed: int, changed: set[int]) -> dict:
    """source -> f/p/f/p... -> aggregate -> f/p/f/p... -> sink, ``n_nodes`` in all."""
    rng = random.Random(seed)
    steps = _Steps(rng, changed)
    n_passive = n_nodes - 3
    before = n_passive // 2
    nodes = [_source("src", "events", rng)]
    prev = "src"
    for i in range(before):
        make = steps.filter_rows if i % 2 == 0 else steps.project_rows
        nodes.append(make(f"a{i}", prev))
        prev = f"a{i}"
    nodes.append(_aggregate("totals", prev))
    prev = "totals"
    for i in range(n_passive - before):
        make = steps.filter_groups if i % 2 == 0 else steps.project_groups
        nodes.append(make(f"b{i}", prev))
        prev = f"b{i}"
    nodes.append(_sink(prev))
    return _plan(nodes)


def branchy_plan(n_nodes: int, seed: int, changed: set[int]) -> dict:
    """Source branches of filter/project chains, unioned into one aggregate, then a filter
    and the sink (each branch: source, filter, project, filter, project)."""
    rng = random.Random(seed)
    steps = _Steps(rng, changed)
    nodes: list[dict] = []
    ends: list[str] = []
    b = 0
    while len(nodes) + 5 + 4 <= n_nodes:
        nodes.append(_source(f"src_{b}", f"events_{b}", rng))
        prev = f"src_{b}"
        for k in range(2):
            nodes.append(steps.filter_rows(f"f_{b}_{k}", prev))
            nodes.append(steps.project_rows(f"p_{b}_{k}", f"f_{b}_{k}"))
            prev = f"p_{b}_{k}"
        ends.append(prev)
        b += 1
    nodes.append({"id": "all", "step": "union", "version": 1, "inputs": ends})
    nodes.append(_aggregate("totals", "all"))
    nodes.append(steps.filter_groups("big", "totals"))
    nodes.append(_sink("big"))
    return _plan(nodes)


SHAPES = {"chain": chain_plan, "branchy": branchy_plan}


def _n_passive(doc: dict) -> int:
    return sum(1 for n in doc["nodes"] if n["step"] in ("filter", "project"))


def make_pair(tmp: Path, shape: str, n_nodes: int, rate: float) -> tuple[Path, Path, int]:
    """Write an old/new pair; ``rate`` of the plan's steps are changed in the new one."""
    build = SHAPES[shape]
    old = build(n_nodes, 7, set())
    n_changes = max(1, round(rate * len(old["nodes"])))
    changed = set(random.Random(11).sample(range(_n_passive(old)), k=n_changes))
    new = build(n_nodes, 7, changed)
    tag = f"{shape}-{n_nodes}-{rate:g}"
    old_p, new_p = tmp / f"{tag}-old.json", tmp / f"{tag}-new.json"
    old_p.write_text(json.dumps(old, indent=2))
    new_p.write_text(json.dumps(new, indent=2))
    return old_p, new_p, n_changes


# -- measuring -----------------------------------------------------------------------------

@dataclass
class Run:
    seconds: float
    max_rss_mb: float
    code: int
    stdout: str


#: Starts one command and reports its wall time and its own peak RSS.  A child's
#: ``ru_maxrss`` starts from the RSS of the process it was forked from (Linux keeps the
#: high-water mark across ``exec``), so the command is forked from this small process, not
#: from the bench, which holds whole plans in memory.
_RUNNER = """
import json, os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.dup2(fd, 1)
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "max_rss_kb": usage.ru_maxrss,
                  "code": os.waitstatus_to_exitcode(status)}))
"""


def run(cmd: list[str], timeout: float | None = None) -> Run:
    """Run ``cmd`` once (through ``_RUNNER``): wall time, peak RSS, exit code, stdout."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with tempfile.NamedTemporaryFile() as out:
        p = subprocess.Popen([sys.executable, "-c", _RUNNER, out.name, *cmd],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                             cwd=ROOT, start_new_session=True)
        try:
            report, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            raise TimeoutError(" ".join(cmd)) from None
        text = Path(out.name).read_text()
    r = json.loads(report)
    if r["code"] not in (0, 1, 3):
        raise RuntimeError(f"{' '.join(cmd)} exited {r['code']}: {err.decode()[-2000:]}")
    return Run(r["seconds"], r["max_rss_kb"] / 1024, r["code"], text)


def median(runs: list[Run]) -> Run:
    return Run(statistics.median(r.seconds for r in runs), max(r.max_rss_mb for r in runs),
               runs[0].code, runs[0].stdout)


_LOAD = "import json,sys\nfor p in sys.argv[1:]:\n    with open(p) as f: json.load(f)"
_LOAD_NO_GC = "import gc\ngc.disable()\n" + _LOAD
_FINDING = re.compile(r"^[✗!·] \[", re.M)


def measure(old_p: Path, new_p: Path, repeat: int, timeout: float | None) -> dict:
    """json.load of both files (gc on, as a plain process does, and off) and the check,
    in turns, so that a busy moment of the machine weighs on all three alike."""
    files = [str(old_p), str(new_p)]
    check = [sys.executable, "-m", "migrate.cli", "check", *files]
    loads, loads_no_gc, checks = [], [], []
    timed_out = False
    for _ in range(repeat):
        loads.append(run([sys.executable, "-c", _LOAD, *files]))
        loads_no_gc.append(run([sys.executable, "-c", _LOAD_NO_GC, *files]))
        if not timed_out:
            try:
                checks.append(run(check, timeout))
            except TimeoutError:
                timed_out = True
    load, load_no_gc = median(loads), median(loads_no_gc)
    row = {"bytes_per_file": old_p.stat().st_size, "json_load_s": round(load.seconds, 3),
           "json_load_no_gc_s": round(load_no_gc.seconds, 3),
           "json_load_rss_mb": round(load.max_rss_mb, 1)}
    if timed_out:
        row.update(check_s=None, ratio=None, ratio_no_gc=None, check_rss_mb=None,
                   verdict=f"timeout (> {timeout:g} s)", findings=None)
        return row
    chk = median(checks)
    verdict = re.match(r"verdict: (\w+)", chk.stdout)
    row.update(check_s=round(chk.seconds, 3), ratio=round(chk.seconds / load.seconds, 2),
               ratio_no_gc=round(chk.seconds / load_no_gc.seconds, 2),
               check_rss_mb=round(chk.max_rss_mb, 1),
               verdict=verdict.group(1) if verdict else "?",
               findings=len(_FINDING.findall(chk.stdout)))
    return row


def small_pair(repeat: int) -> dict:
    small = ROOT / "fixtures" / "plans" / "ship_load.json"
    bares, cmds = [], []
    for _ in range(repeat):
        bares.append(run([sys.executable, "-c", "pass"]))
        cmds.append(run([sys.executable, "-m", "migrate.cli", "check", str(small),
                         str(small)]))
    bare, cmd = median(bares), median(cmds)
    return {"bare_interpreter_s": round(bare.seconds, 4),
            "small_check_s": round(cmd.seconds, 4),
            "small_check_over_bare": round(cmd.seconds / bare.seconds, 2),
            "target": TARGET_SMALL}


# -- output --------------------------------------------------------------------------------

def _fmt(v: object, suffix: str = "") -> str:
    return "—" if v is None else f"{v}{suffix}"


def markdown(result: dict) -> str:
    lines = ["# theseus check: time over json.load of both files", "",
             f"python {result['python']}, {result['cpus']} CPUs, median of "
             f"{result['repeat']} runs, each a separate process: `python -c 'json.load "
             "both files'` against `python -m migrate.cli check old new` (what `theseus "
             "check` runs). The check disables the cyclic garbage collector while it "
             "works; a plain `json.load` process does not, so the gc-off column is the "
             "stricter baseline. Peak RSS is each process's own `ru_maxrss`. "
             f"Target: check ≤ {TARGET_RATIO:g}x json.load for every row.", "",
             f"## {result['size']:,}-node pairs by change rate", "",
             "| shape | nodes | changed | findings | verdict | json.load s | check s | "
             "**check / json.load** | json.load, gc off s | check / (gc off) | "
             "peak RSS check MB | peak RSS json.load MB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rates"]:
        lines.append(f"| {r['shape']} | {r['nodes']} | {r['changed']} ({r['rate']:.1%}) | "
                     f"{_fmt(r['findings'])} | {r['verdict']} | {r['json_load_s']} | "
                     f"{_fmt(r['check_s'])} | **{_fmt(r['ratio'], 'x')}** | "
                     f"{r['json_load_no_gc_s']} | {_fmt(r['ratio_no_gc'], 'x')} | "
                     f"{_fmt(r['check_rss_mb'])} | {r['json_load_rss_mb']} |")
    lines += ["", f"## Growth with plan size ({GROWTH_RATE:.0%} of steps changed)", "",
              "| shape | nodes | changed | json.load s | check s | check / json.load | "
              "check s per 1k nodes | peak RSS check MB |",
              "|---|---|---|---|---|---|---|---|"]
    for r in result["growth"]:
        per_k = None if r["check_s"] is None else round(r["check_s"] / r["nodes"] * 1000, 4)
        lines.append(f"| {r['shape']} | {r['nodes']} | {r['changed']} | {r['json_load_s']} | "
                     f"{_fmt(r['check_s'])} | {_fmt(r['ratio'], 'x')} | {_fmt(per_k)} | "
                     f"{_fmt(r['check_rss_mb'])} |")
    before = result.get("before")
    if before:
        lines += ["", f"## Before and after ({before['label']} against {result['label']})",
                  "", "The same bench run on the checker before this work (difflib "
                  "alignment, a graph search per filter finding, every up x down pair "
                  "of filter findings tried): the same plans, the same machine, another "
                  "moment (the machine is shared, so single figures move by tens of "
                  "percent).", "",
                  "| shape | nodes | changed | check s before | check / json.load before | "
                  "check s after | check / json.load after | speed-up |",
                  "|---|---|---|---|---|---|---|---|"]
        old_rows = {(r["shape"], r["nodes"], r["rate"]): r
                    for r in before["rates"] + before["growth"]}
        seen = set()
        for r in result["rates"] + result["growth"]:
            key = (r["shape"], r["nodes"], r["rate"])
            b = old_rows.get(key)
            if b is None or key in seen:
                continue
            seen.add(key)
            if b["check_s"] is None:
                was, was_ratio, gain = b["verdict"], "—", None
                if r["check_s"]:
                    gain = f"> {before['timeout'] / r['check_s']:.0f}x"
            else:
                was, was_ratio = b["check_s"], f"{b['ratio']}x"
                gain = f"{b['check_s'] / r['check_s']:.1f}x" if r["check_s"] else None
            lines.append(f"| {r['shape']} | {r['nodes']} | {r['changed']} ({r['rate']:.1%}) | "
                         f"{was} | {was_ratio} | {_fmt(r['check_s'])} | "
                         f"{_fmt(r['ratio'], 'x')} | {_fmt(gain)} |")
    s = result["small"]
    lines += ["", "## Small pair (fixtures/plans/ship_load.json against itself)", "",
              f"bare interpreter {s['bare_interpreter_s']} s, theseus check "
              f"{s['small_check_s']} s: **{s['small_check_over_bare']}x** "
              f"(target ≤ {TARGET_SMALL:g}x)", ""]
    return "\n".join(lines)


def write_growth_csv(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["shape", "nodes", "changed", "json_load_s", "check_s", "ratio",
                    "check_rss_mb"])
        for r in rows:
            w.writerow([r["shape"], r["nodes"], r["changed"], r["json_load_s"], r["check_s"],
                        r["ratio"], r["check_rss_mb"]])


def plot_growth(rows: list[dict], path: Path, before: dict | None = None) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for shape in SHAPES:
        pts = [r for r in rows if r["shape"] == shape and r["check_s"] is not None]
        if pts:
            ax.plot([r["nodes"] for r in pts], [r["check_s"] for r in pts], "o-",
                    label=f"theseus check ({shape})")
            ax.plot([r["nodes"] for r in pts], [r["json_load_s"] for r in pts], "x--",
                    label=f"json.load both ({shape})")
            top = pts[-1]
            ax.plot([r["nodes"] for r in pts],
                    [top["check_s"] * r["nodes"] / top["nodes"] for r in pts], ":",
                    color="grey", linewidth=1)
        old_pts = [r for r in (before or {}).get("growth", [])
                   if r["shape"] == shape and r["check_s"] is not None]
        if old_pts:
            ax.plot([r["nodes"] for r in old_pts], [r["check_s"] for r in old_pts], "s-.",
                    alpha=0.6, label=f"before: check ({shape}; missing = timed out)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("nodes per plan")
    ax.set_ylabel("seconds (one process, median)")
    ax.set_title(f"theseus check vs json.load, {GROWTH_RATE:.0%} of steps changed\n"
                 "(dotted: linear in the plan size)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "this tree"
    return f"commit {out}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5, help="runs per figure (median)")
    ap.add_argument("--timeout", type=float, default=150.0,
                    help="give up on one check after this many seconds")
    ap.add_argument("--quick", action="store_true", help="small plans, one run: a smoke test")
    ap.add_argument("--out", type=Path, default=RESULTS, help="directory for the figures")
    ap.add_argument("--before", type=Path, default=RESULTS / "check_speed_before.json",
                    help="figures of this bench on older code, to compare (if it exists)")
    ap.add_argument("--label", default=None,
                    help="what is measured (default: the git commit of the tree)")
    args = ap.parse_args(argv)
    repeat = 1 if args.quick else args.repeat
    size = 2_000 if args.quick else 20_000
    sizes = (500, 1_000, 2_000) if args.quick else SIZES
    tmp = Path(tempfile.mkdtemp(prefix="theseus-bench-"))
    result: dict = {"label": args.label or _commit(), "python": sys.version.split()[0],
                    "cpus": os.cpu_count(), "repeat": repeat, "size": size,
                    "timeout": args.timeout, "target_ratio": TARGET_RATIO, "rates": [],
                    "growth": []}
    started = time.perf_counter()

    def row(shape: str, n: int, rate: float) -> dict:
        old_p, new_p, k = make_pair(tmp, shape, n, rate)
        r = {"shape": shape, "nodes": n, "rate": rate, "changed": k,
             **measure(old_p, new_p, repeat, args.timeout)}
        print(f"  {shape:8} {n:6} nodes {k:5} changed: json.load {r['json_load_s']} s, "
              f"check {_fmt(r['check_s'])} s ({_fmt(r['ratio'], 'x')}), "
              f"{_fmt(r['check_rss_mb'])} MB, {r['verdict']}, {_fmt(r['findings'])} findings",
              flush=True)
        old_p.unlink()
        new_p.unlink()
        return r

    print(f"change rates, {size}-node pairs:", flush=True)
    for shape in SHAPES:
        for rate in RATES:
            result["rates"].append(row(shape, size, rate))
    print(f"growth, {GROWTH_RATE:.0%} changed:", flush=True)
    for shape in SHAPES:
        for n in sizes:
            result["growth"].append(row(shape, n, GROWTH_RATE))
    result["small"] = small_pair(3 if args.quick else 10)
    result["bench_s"] = round(time.perf_counter() - started, 1)
    tmp.rmdir()

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "check_speed.json").write_text(json.dumps(result, indent=2) + "\n")
    if args.before.exists() and args.before.resolve() != (args.out / "check_speed.json"
                                                          ).resolve():
        before = json.loads(args.before.read_text())
        if before.get("size") == size:
            result["before"] = before
    text = markdown(result)
    (args.out / "check_speed.md").write_text(text)
    write_growth_csv(result["growth"], args.out / "check_speed_growth.csv")
    plotted = plot_growth(result["growth"], args.out / "check_speed_growth.png",
                          result.get("before"))
    print()
    print(text)
    print(f"bench took {result['bench_s']} s; figures in {args.out}"
          + ("" if plotted else " (no plot: matplotlib is not installed)"))
    worst = max((r["ratio"] for r in result["rates"] if r["ratio"] is not None), default=0)
    if any(r["ratio"] is None for r in result["rates"]) or worst > TARGET_RATIO:
        print(f"note: above the {TARGET_RATIO:g}x target (worst {worst}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
