"""The truth corpus (issue 28 item 2): ``theseus prove`` over the fixtures' upgrade pairs,
under both runtimes, one Spark session and one broker for all of them.

    python bench/truth.py [PAIR...] [--runtime theseus,spark] [--records N]
                          [--skip-done] [--budget SECONDS] [--jobs N]
                          [--out bench/results/truth]

PAIR is ``upgrades/<case>`` (a folder of fixtures/upgrades, JSON plans) or
``pyspark/<case>`` (a folder of fixtures/pyspark/upgrades, job files), or a bare case name
of fixtures/upgrades; default: every pair.  The SQL twins of fixtures/upgrades
(``old.sql``) are not proven again: they compile to the same plans up to pruning
(tests/test_three_forms.py), and tests/test_prove.py proves one through the loader.

Each (pair, runtime) is one row of ``<out>.jsonl``: pair, verdict, predicted restart, Spark's
outcome, agreement, seconds, the seed and record count, the commit and the code it ran
(:func:`code_id`); or why it did not run (the refusals of ``prove``: recursion,
nondeterminism, a plan no PySpark job can say under ``--runtime spark``).  Rows are
appended as each proof ends; the last row of a (pair, runtime) wins.  So the corpus runs in
slices that add up: ``--skip-done --budget 480`` skips what was proven by the same code
with the same seed and records, and starts no proof after 480 s.  ``<out>.md`` is written
from the last rows each time.  ``--jobs 2`` (the default) proves two pairs side by side
on the one session: a proof's queries wait on triggers, Kafka and the driver much of the
time, so a second one uses cores the first leaves idle.  Needs ``KAFKA_BOOTSTRAP`` (``make
kafka``) and runs Spark: run it under the machine's lock.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from compat.errors import TheseusError  # noqa: E402
from migrate import prove  # noqa: E402

FIXTURES = ROOT / "fixtures"
RUNTIMES = ("theseus", "spark")
#: what a proof's outcome depends on: the checker, prove and the builders, the gates
CODE = ("compat", "migrate", "gates")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def code_id() -> tuple[str, str]:
    """(HEAD's commit, an id of the code a proof runs: CODE's trees at HEAD plus any
    uncommitted change to them).  A commit that changes docs or results only keeps the id,
    so the slices of one corpus run add up across such commits."""
    try:
        head = _git("rev-parse", "--short=12", "HEAD")
        trees = _git("rev-parse", *(f"HEAD:{d}" for d in CODE))
        dirty = _git("diff", "HEAD", "--", *CODE)
    except (OSError, subprocess.CalledProcessError):
        return "unknown", "unknown"
    code = hashlib.sha1((trees + dirty).encode()).hexdigest()[:12]
    return head + ("+dirty" if dirty else ""), code


def corpus() -> list[str]:
    """Every upgrade pair of the fixtures, as ``upgrades/<case>`` or ``pyspark/<case>``."""
    up = [f"upgrades/{p.name}" for p in sorted((FIXTURES / "upgrades").iterdir())
          if (p / "old.json").exists()]
    jobs = [f"pyspark/{p.name}" for p in sorted((FIXTURES / "pyspark" / "upgrades").iterdir())
            if (p / "old.py").exists()]
    return up + jobs


def files(pair: str) -> tuple[str, str]:
    kind, _, case = pair.partition("/")
    if kind == "pyspark":
        d = FIXTURES / "pyspark" / "upgrades" / case
        return str(d / "old.py"), str(d / "new.py")
    d = FIXTURES / "upgrades" / case
    return str(d / "old.json"), str(d / "new.json")


def row(pair: str, rt: prove.Runtime, records: int, seed: int = 0,
        code: tuple[str, str] = ("unknown", "unknown"), state_partitions: int | None = None
        ) -> dict:
    started = time.monotonic()
    base = {"pair": pair, "runtime": rt.name, "seed": seed, "records": records,
            "commit": code[0], "code": code[1], "state_partitions": state_partitions}
    old, new = files(pair)
    try:
        p = prove.prove(old, new, rt, records=records, seed=seed,
                        state_partitions=state_partitions)
    except TheseusError as e:
        return {**base, "ran": False, "why": e.render(), "exit": e.exit_code,
                "seconds": round(time.monotonic() - started, 1)}
    except Exception as e:  # noqa: BLE001 - one pair's crash must not end the corpus
        return {**base, "ran": False, "why": f"crash: {type(e).__name__}: {e}"[:500],
                "exit": None, "seconds": round(time.monotonic() - started, 1)}
    doc = p.to_json()
    pred = doc["predicted"] or {}
    return {**base, "ran": True, "verdict": doc["verdict"],
            "predicted": pred.get("outcome"), "predicted_error": pred.get("error_class"),
            "outcome": doc["outcome"], "error_class": doc["error_class"],
            "agrees": doc["agrees"], "verdict_agrees": doc["verdict_agrees"],
            "false_green": doc["false_green"], "conservative": doc["conservative"],
            "vacuous": doc["vacuous"],
            "prediction_agrees": doc["prediction_agrees"], "judged": doc["judged"],
            "findings": [f["code"] for f in doc["findings"]],
            "differences": doc["differences"], "error": doc["error"],
            "timings": doc["timings"], "old_batches": doc["counts"].get("old_batches"),
            "seconds": round(time.monotonic() - started, 1)}


def classified(r: dict) -> dict:
    """Row ``r`` as prove classifies it now: rows written before vacuous proofs had a class
    of their own counted a correct start that compared no row as agreement (green verdict)
    or conservative (migrate, unsupported)."""
    if not r["ran"] or "vacuous" in r:
        return r
    pred = {"outcome": r["predicted"], "error_class": r["predicted_error"]} \
        if r.get("predicted") else None
    return {**r, **prove.agreement(r["verdict"], r["outcome"], r["error_class"], pred,
                                   vacuous=bool(r["judged"].get("vacuous")))}


def _mark(r: dict) -> str:
    if not r["ran"]:
        return "not run"
    if r["agrees"]:
        return "yes"
    if r["vacuous"] and r["prediction_agrees"] is not False:
        return "vacuous: no row compared"
    if r["false_green"]:
        return "**FALSE GREEN**"
    if r["conservative"]:
        return "conservative"
    return "prediction differs" if r["verdict_agrees"] is not False else "no"


def _spark(r: dict | None) -> str:
    if r is None:
        return ""
    if not r["ran"]:
        first = r["why"].splitlines()[0]
        return f"not run: {first[:110]}"
    return (r["outcome"] + (f" ({r['error_class']})" if r["error_class"] else "")
            + f"; {_mark(r)}")


def summary(rows: list[dict], rt: str) -> list[str]:
    mine = [classified(r) for r in rows if r["runtime"] == rt]
    ran = [r for r in mine if r["ran"]]
    why = Counter(_refusal(r) for r in mine if not r["ran"])
    return [
        f"**runtime {rt}**: {len(ran)} pairs ran of {len(mine)} tried "
        f"({sum(r['seconds'] for r in mine) / 60:.1f} min of proofs); "
        f"{sum(r['agrees'] for r in ran)} agree, "
        f"{sum(r['false_green'] for r in ran)} false greens, "
        f"{sum(r['conservative'] for r in ran)} conservative, "
        f"{sum(r['verdict_agrees'] is True and not r['agrees'] for r in ran)} where only "
        "the predicted restart differs, "
        f"{sum(r['vacuous'] for r in ran)} vacuous (no row compared: neither agreement nor "
        "disagreement)."
        + (" Not run: " + "; ".join(f"{n} {w}" for w, n in why.most_common()) + "."
           if why else ""),
    ]


def _refusal(r: dict) -> str:
    w = r["why"]
    for key, text in (("recursive", "recursive steps"), ("nondeterministic",
                                                         "nondeterministic new plans"),
                      ("PySpark job", "plans no PySpark job can say"),
                      ("crash", "crashed")):
        if key in w:
            return text
    return w.splitlines()[0][:80]


def markdown(rows: list[dict], note: str) -> str:
    rows = [classified(r) for r in rows]
    by = {(r["pair"], r["runtime"]): r for r in rows}
    pairs = list(dict.fromkeys(r["pair"] for r in rows))
    out = ["# The truth corpus: `theseus prove` over the fixtures' upgrade pairs", "",
           "Written by `make truth` (bench/truth.py); one row per pair and runtime in "
           "truth.jsonl. *predicted*: `check --checkpoint` on OLD's real checkpoint.", "",
           note, "", *summary(rows, "theseus"), "", *summary(rows, "spark"), "",
           "| pair | verdict | predicted | Spark, runtime theseus | Spark, runtime spark |",
           "|---|---|---|---|---|"]
    for pair in pairs:
        t, s = by.get((pair, "theseus")), by.get((pair, "spark"))
        ran = next((r for r in (t, s) if r and r["ran"]), None)
        verdict = ran["verdict"] if ran else ""
        pred = "" if ran is None else (ran["predicted"] or "") + (
            f" ({ran['predicted_error']})" if ran["predicted_error"] else "")
        out.append(f"| {pair} | {verdict} | {pred} | {_spark(t)} | {_spark(s)} |")
    codes = Counter((r.get("commit") or "before code ids", r.get("code") or "-")
                    for r in rows)
    out += ["", "Rows per commit and code id (bench/truth.py `code_id`: the trees of "
            f"{', '.join(CODE)}): " + "; ".join(f"{c} (code {k}): {n}" for (c, k), n in
                                              sorted(codes.items()))]
    out += _listed("Conservative verdicts",
                   "A `migrate` or `unsupported` verdict where Spark restarts and keeps the "
                   "promise of an in-place restart (README: which could be relaxed).",
                   [r for r in rows if r["ran"] and r["conservative"]])
    out += _listed("Vacuous proofs",
                   "Spark restarts, but no row was compared (`prove` exits 8): these proofs "
                   "say nothing of the verdict, neither agreement nor a conservative verdict.",
                   [r for r in rows if r["ran"] and r["vacuous"]])
    wrong = [r for r in rows if r["ran"] and not r["agrees"] and not r["conservative"]
             and not (r["vacuous"] and r["prediction_agrees"] is not False)]
    if wrong:
        out += ["", "## Disagreements", ""]
        for r in wrong:
            out.append(f"- {r['pair']} ({r['runtime']}): verdict {r['verdict']}, Spark "
                       f"{r['outcome']}" + (f" ({r['error_class']})" if r["error_class"]
                                            else "")
                       + f", predicted {r['predicted']}: {_mark(r)}; findings "
                       f"{', '.join(r['findings']) or 'none'}")
            for d in r["differences"][:3]:
                out.append(f"  - {d}")
    return "\n".join(out) + "\n"


def _listed(title: str, intro: str, rows: list[dict]) -> list[str]:
    """A section of truth.md listing ``rows`` with verdict and findings (none if empty)."""
    if not rows:
        return []
    return ["", f"## {title}", "", intro, ""] + [
        f"- {r['pair']} ({r['runtime']}): {r['verdict']}; findings "
        f"{', '.join(r['findings']) or 'none'}" for r in rows]


def load(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln]


def done(r: dict | None, code: str, seed: int, records: int,
         state_partitions: int | None = None) -> bool:
    """Whether row ``r`` is a proof the same code made with the same seed, records and
    state partitions."""
    return r is not None and (r.get("code"), r.get("seed"), r.get("records"),
                              r.get("state_partitions")) == \
        (code, seed, records, state_partitions)


def todo(pairs: list[str], runtimes: list[str], rows: dict[tuple[str, str], dict],
         code: str, seed: int, records: int, skip_done: bool,
         state_partitions: int | None = None) -> list[tuple[str, str]]:
    """The (pair, runtime) proofs to run, in order.  With ``skip_done``, those the same
    code proved with the same seed and records are left out, and those never proven come
    before those proven by other code: a budgeted slice first runs what the corpus lacks."""
    every = [(p, n) for p in pairs for n in runtimes]
    if not skip_done:
        return every
    left = [k for k in every
            if not done(rows.get(k), code, seed, records, state_partitions)]
    return sorted(left, key=lambda k: k in rows)


def run_side_by_side(queue: list[tuple[str, str]],
                     runtimes: Callable[[], dict[str, prove.Runtime]],
                     record: Callable[[dict], None], *, jobs: int, budget: float | None,
                     records: int, seed: int, code: tuple[str, str],
                     state_partitions: int | None = None) -> None:
    """Prove every (pair, runtime) of ``queue`` in order, ``jobs`` proofs at a time, and
    ``record`` each row as it ends; start none after ``budget`` seconds.  Each worker has
    runtimes of its own (``runtimes()``: a runtime keeps its transactional producer and
    the end offsets of what it produced); they share the one Spark session, whose conf
    prove sets under ``prove.SESSION``."""
    lock = threading.Lock()
    started = time.monotonic()

    def worker() -> None:
        mine = runtimes()
        while True:
            with lock:
                if not queue or (budget is not None and
                                 time.monotonic() - started > budget):
                    return
                pair, name = queue.pop(0)
            record(row(pair, mine[name], records, seed, code, state_partitions))

    workers = [threading.Thread(target=worker, name=f"truth-{i}")
               for i in range(max(1, jobs))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("pairs", nargs="*")
    ap.add_argument("--runtime", default=",".join(RUNTIMES),
                    help="comma-separated: theseus, spark")
    ap.add_argument("--records", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-done", action="store_true",
                    help="skip the (pair, runtime) rows the same code proved with the same "
                         "seed and records")
    ap.add_argument("--budget", type=float, default=None,
                    help="start no proof after this many seconds")
    ap.add_argument("--jobs", type=int, default=2,
                    help="proofs run side by side on the one Spark session")
    ap.add_argument("--state-partitions", type=int, default=2,
                    help="run both plans of a pair with this many state partitions where "
                         "they ask for the same count (0: the plans' own)")
    ap.add_argument("--note", default="", help="a line for truth.md (what was run)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "truth"))
    ap.add_argument("--report-only", action="store_true",
                    help="write <out>.md from <out>.jsonl; no Spark, no broker")
    args = ap.parse_args()
    jsonl, md = Path(f"{args.out}.jsonl"), Path(f"{args.out}.md")
    rows = {(r["pair"], r["runtime"]): r for r in load(jsonl)}
    if args.report_only:
        write_report(md, rows, args.note)
        return 0
    runtimes = [r for r in args.runtime.split(",") if r]
    if not set(runtimes) <= set(RUNTIMES):
        print(f"truth: --runtime takes {', '.join(RUNTIMES)}", file=sys.stderr)
        return 2
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
    if not bootstrap:
        print("truth: KAFKA_BOOTSTRAP is not set (make kafka starts a broker)",
              file=sys.stderr)
        return 2
    pairs = [p if "/" in p else f"upgrades/{p}" for p in args.pairs] or corpus()
    missing = [p for p in pairs if not all(Path(f).exists() for f in files(p))]
    if missing:
        print(f"truth: no such pair: {', '.join(missing)} (expected a folder of "
              "fixtures/upgrades or fixtures/pyspark/upgrades with its old and new plan)",
              file=sys.stderr)
        return 2
    from migrate.adopt.jars import connector_jars
    from migrate.run import spark_session

    # one session for both runtimes: the connector's jars are on it from the start
    spark = spark_session(jars=connector_jars())
    code = code_id()
    queue = todo(pairs, runtimes, rows, code[1], args.seed, args.records, args.skip_done,
                 args.state_partitions or None)
    jsonl_lock = threading.Lock()
    started = time.monotonic()
    ran: list[float] = []

    def record(r: dict) -> None:
        with jsonl_lock:
            rows[(r["pair"], r["runtime"])] = r
            ran.append(r["seconds"])
            with jsonl.open("a", encoding="utf-8") as f:
                f.write(json.dumps(r) + "\n")
            print(f"{r['pair']:58} {r['runtime']:8} {r.get('verdict', '-'):11} "
                  f"{r.get('outcome') or 'not run':15} {r.get('error_class') or ''} "
                  f"{_mark(r)} {r['seconds']} s", flush=True)

    run_side_by_side(queue, lambda: {name: prove.RUNTIMES[name](bootstrap, spark=spark)
                                     for name in runtimes},
                     record, jobs=args.jobs, budget=args.budget, records=args.records,
                     seed=args.seed, code=code, state_partitions=args.state_partitions or None)
    wall = time.monotonic() - started
    print(f"truth: {len(ran)} proofs in {wall:.0f} s with --jobs {max(1, args.jobs)} "
          f"({sum(ran):.0f} s of proofs; load {os.getloadavg()[0]:.2f} at the end)",
          flush=True)
    write_report(md, rows, args.note)
    return 0


def write_report(md: Path, rows: dict[tuple[str, str], dict], note: str) -> None:
    ordered = sorted(rows.values(), key=lambda r: (r["pair"], r["runtime"]))
    md.write_text(markdown(ordered, note), encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
