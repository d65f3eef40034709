"""Benchmark: the cost of ``theseus check`` against ``json.load`` of the same two files.

Targets (issue 2): for a 20,000-node plan pair with 1% of predicates changed, the check
costs at most 3x ``json.load`` of the two files, measured in the same run; on small plans
the whole command stays within 10x a bare interpreter start.

Run: ``make bench`` (or ``python bench/check_speed.py``).  Figures go to
``bench/results/check_speed.json``.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

REGIONS = ["eu", "us", "apac", "latam", "mea"]


def big_plan(n_nodes: int, seed: int, changed: set[int] | None = None) -> dict:
    """A realistic large plan: many source branches of filter/project chains, unioned
    into one aggregate per group of branches, then a final union, aggregate and sink."""
    rng = random.Random(seed)
    changed = changed or set()
    nodes: list[dict] = []
    branch_ends: list[str] = []
    pred_index = 0
    b = 0
    # each branch: source, filter, project, filter, project  (5 nodes)
    while len(nodes) + 5 + 4 < n_nodes:
        src = f"src_{b}"
        nodes.append({
            "id": src, "step": "source", "version": 1, "topic": f"events_{b}",
            "partitions": rng.choice([3, 6, 12]), "format": "json", "role": "stream",
            "schema": [{"name": "user_id", "type": "string"},
                       {"name": "region", "type": "string"},
                       {"name": "amount", "type": "double"},
                       {"name": "qty", "type": "int"},
                       {"name": "ts", "type": "timestamp"}],
            "event_time": {"column": "ts", "watermark": "1 minute"}})
        prev = src
        for k in range(2):
            limit = rng.randint(1, 10_000)
            if pred_index in changed:
                limit += 1
            region = rng.choice(REGIONS)
            nodes.append({"id": f"f_{b}_{k}", "step": "filter", "version": 1, "inputs": [prev],
                          "predicate": f"amount > {limit} AND region <> '{region}'"})
            pred_index += 1
            nodes.append({"id": f"p_{b}_{k}", "step": "project", "version": 1,
                          "inputs": [f"f_{b}_{k}"],
                          "columns": [{"name": "user_id", "expr": "user_id"},
                                      {"name": "region", "expr": "upper(region)"},
                                      {"name": "amount",
                                       "expr": f"amount * {rng.randint(1, 9)}.5"},
                                      {"name": "qty", "expr": "qty"},
                                      {"name": "ts", "expr": "ts"}]})
            prev = f"p_{b}_{k}"
        branch_ends.append(prev)
        b += 1
    nodes.append({"id": "all", "step": "union", "version": 1, "inputs": branch_ends})
    nodes.append({"id": "totals", "step": "aggregate", "version": 1, "inputs": ["all"],
                  "group_by": [{"name": "region", "expr": "region"}],
                  "aggregates": [{"name": "revenue", "function": "sum", "args": ["amount"]},
                                 {"name": "orders", "function": "count", "args": ["*"]}]})
    nodes.append({"id": "big", "step": "filter", "version": 1, "inputs": ["totals"],
                  "predicate": "revenue > 1000"})
    nodes.append({"id": "out", "step": "sink", "version": 1, "inputs": ["big"],
                  "topic": "region_totals", "format": "json", "key_columns": ["region"],
                  "mode": "update", "delivery": "exactly_once"})
    return {"format": "theseus.plan/1", "query": "big", "config": {"state_partitions": 8},
            "nodes": nodes}


def timed(fn, repeat: int) -> float:
    best = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best.append(time.perf_counter() - t)
    return statistics.median(best)


def main() -> int:
    from compat import expr as E
    from compat.check import check_files

    tmp = Path(tempfile.mkdtemp(prefix="theseus-bench-"))
    old_doc = big_plan(20_000, seed=7)
    n_preds = sum(1 for n in old_doc["nodes"] if n["step"] == "filter") - 1
    rng = random.Random(11)
    changed = set(rng.sample(range(n_preds), k=max(1, n_preds // 100)))
    new_doc = big_plan(20_000, seed=7, changed=changed)
    old_p, new_p = tmp / "old.json", tmp / "new.json"
    old_p.write_text(json.dumps(old_doc, indent=2))
    new_p.write_text(json.dumps(new_doc, indent=2))

    def load_both():
        with open(old_p) as f:
            json.load(f)
        with open(new_p) as f:
            json.load(f)

    def check():
        # Cold caches each time: the CLI runs once per process.
        E.clear_caches()
        return check_files(str(old_p), str(new_p))

    def load_both_no_gc():
        import gc
        gc.disable()
        try:
            load_both()
        finally:
            gc.enable()

    report = check()
    t_json = timed(load_both, 5)
    t_json_nogc = timed(load_both_no_gc, 5)
    t_check = timed(check, 5)

    # Small plans: the whole command against a bare interpreter start.
    small = ROOT / "fixtures" / "plans" / "ship_load.json"
    theseus = [sys.executable, "-m", "migrate.cli", "check", str(small), str(small)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t_bare = timed(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True), 10)
    t_cmd = timed(lambda: subprocess.run(theseus, check=True, env=env,
                                         stdout=subprocess.DEVNULL), 10)
    result = {
        "nodes_per_plan": len(old_doc["nodes"]),
        "bytes_per_file": old_p.stat().st_size,
        "predicates_changed": len(changed),
        "verdict": report.verdict,
        "findings": len(report.findings),
        "json_load_both_s": round(t_json, 4),
        "check_s": round(t_check, 4),
        "check_over_json_load": round(t_check / t_json, 2),
        "json_load_both_gc_disabled_s": round(t_json_nogc, 4),
        "check_over_json_load_gc_disabled": round(t_check / t_json_nogc, 2),
        "target_check_over_json_load": 3.0,
        "bare_interpreter_s": round(t_bare, 4),
        "small_check_command_s": round(t_cmd, 4),
        "small_command_over_bare": round(t_cmd / t_bare, 2),
        "target_small_command_over_bare": 10.0,
        "python": sys.version.split()[0],
    }
    out = ROOT / "bench" / "results" / "check_speed.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
