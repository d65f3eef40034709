"""The truth corpus (issue 28 item 2, first cut): ``theseus prove`` over fixture upgrade
pairs, one Spark session and one broker for all of them.

    python bench/truth.py [PAIR...] [--records N] [--out bench/results/truth]

PAIR is a folder of fixtures/upgrades (default: every pair prove can run).  Writes
``<out>.jsonl`` (one line per pair: pair, verdict, predicted restart, Spark's outcome,
agreement) and ``<out>.md``; prints one line per pair as it goes.  Needs
``KAFKA_BOOTSTRAP`` (``make kafka``) and runs Spark: run it under the machine's lock.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from compat.errors import TheseusError  # noqa: E402
from migrate import prove  # noqa: E402

UP = ROOT / "fixtures" / "upgrades"


def row(name: str, rt: prove.Runtime, records: int) -> dict:
    started = time.monotonic()
    try:
        p = prove.prove(str(UP / name / "old.json"), str(UP / name / "new.json"), rt,
                        records=records)
    except TheseusError as e:
        return {"pair": name, "ran": False, "why": e.render(), "exit": e.exit_code,
                "seconds": round(time.monotonic() - started, 1)}
    doc = p.to_json()
    pred = doc["predicted"] or {}
    return {"pair": name, "ran": True, "runtime": "theseus", "verdict": doc["verdict"],
            "predicted": pred.get("outcome"), "predicted_error": pred.get("error_class"),
            "outcome": doc["outcome"], "error_class": doc["error_class"],
            "agrees": doc["agrees"], "false_green": doc["false_green"],
            "conservative": doc["conservative"],
            "prediction_agrees": doc["prediction_agrees"], "judged": doc["judged"],
            "differences": doc["differences"], "error": doc["error"],
            "seconds": round(time.monotonic() - started, 1)}


def markdown(rows: list[dict]) -> str:
    out = ["| pair | verdict | predicted | Spark (theseus runtime) | agrees |",
           "|---|---|---|---|---|"]
    for r in rows:
        if not r["ran"]:
            out.append(f"| {r['pair']} | | | not run: {r['why'][:120]} | |")
            continue
        spark = r["outcome"] + (f" ({r['error_class']})" if r["error_class"] else "")
        pred = (r["predicted"] or "") + (f" ({r['predicted_error']})"
                                         if r["predicted_error"] else "")
        mark = ("yes (vacuous: no row compared)" if r["judged"].get("vacuous") else "yes") \
            if r["agrees"] else ("**FALSE GREEN**" if r["false_green"] else
                                          "conservative" if r["conservative"] else "no")
        out.append(f"| {r['pair']} | {r['verdict']} | {pred} | {spark} | {mark} |")
    ran = [r for r in rows if r["ran"]]
    out.append("")
    out.append(f"{len(ran)} pairs ran ({sum(r['seconds'] for r in rows):.0f} s); "
               f"{sum(r['false_green'] for r in ran)} false greens, "
               f"{sum(r['conservative'] for r in ran)} conservative, "
               f"{sum(not r['agrees'] for r in ran)} disagreements in all.")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("pairs", nargs="*")
    ap.add_argument("--records", type=int, default=60)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "truth"))
    args = ap.parse_args()
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
    if not bootstrap:
        print("truth: KAFKA_BOOTSTRAP is not set (make kafka starts a broker)",
              file=sys.stderr)
        return 2
    pairs = args.pairs or sorted(p.name for p in UP.iterdir() if (p / "old.json").exists())
    rt = prove.SparkRuntime(bootstrap)
    rows = []
    with open(f"{args.out}.jsonl", "w", encoding="utf-8") as f:
        for name in pairs:
            r = row(name, rt, args.records)
            rows.append(r)
            f.write(json.dumps(r) + "\n")
            f.flush()
            print(f"{name:55} {r.get('verdict', '-'):11} "
                  f"{r.get('outcome') or 'not run':15} {r.get('error_class') or ''} "
                  f"agrees={r.get('agrees')} {r['seconds']} s", flush=True)
    Path(f"{args.out}.md").write_text(markdown(rows), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
