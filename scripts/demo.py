"""`make demo`: the main job end to end on the embedded defaults.

Part 1 (checker): every upgrade pair under fixtures/upgrades/ goes through
`theseus check`; the verdicts are printed and compared with each pair's expect.json.
Part 2 (fleet): fixtures/fleets/ship, the ship-load query and two queries reading its alerts,
as one global plan; a change to the ship-load query whose impact lands on a consumer.
Part 3: scripts/demo_run.py (run on real Kafka); part 4: scripts/demo_migrate.py (live changes).
The local broker that parts 3 and 4 start is stopped at the end; one that was running before
the demo is left running, and the last lines say so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
THESEUS = [sys.executable, "-m", "migrate.cli"]


def checker_part() -> int:
    cases = sorted(p for p in (ROOT / "fixtures" / "upgrades").iterdir() if p.is_dir())
    print(f"== theseus check on {len(cases)} upgrade pairs ==")
    wrong = 0
    counts: dict[str, int] = {}
    for case in cases:
        expect = json.loads((case / "expect.json").read_text())
        args = THESEUS + ["check", str(case / "old.json"), str(case / "new.json"),
                          "--format", "json"]
        if expect.get("require"):
            args += ["--require", expect["require"]]
        if expect.get("schema_compat"):
            args += ["--schema-compat", expect["schema_compat"]]
        out = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
        report = json.loads(out.stdout)
        verdict = report["verdict"]
        counts[verdict] = counts.get(verdict, 0) + 1
        ok = verdict == expect["verdict"]
        wrong += not ok
        codes = ", ".join(sorted({f["code"] for f in report["findings"]})) or "-"
        print(f"  {'ok ' if ok else 'BAD'} {case.name:<50} {verdict:<12} exit {out.returncode}"
              f"  {codes}")
    print("verdicts: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    print(f"{len(cases) - wrong} of {len(cases)} verdicts as expected")
    example = ROOT / "fixtures" / "upgrades" / "ship_load_capacity_rule_changed"
    print("\n== the ship-load capacity rule changed, as a person reads it ==")
    subprocess.run(THESEUS + ["check", str(example / "old.json"), str(example / "new.json")],
                   cwd=ROOT)
    return 1 if wrong else 0


def fleet_part() -> int:
    """The ship fleet, then the ship-load query renaming its output column 'capacity' to
    'max_capacity': harmless for the query itself, but the pager query reads 'capacity'."""
    fleet = ROOT / "fixtures" / "fleets" / "ship"
    print("\n== a fleet: the ship-load query and two queries reading its alerts ==")
    print("$ theseus fleet show fixtures/fleets/ship")
    subprocess.run(THESEUS + ["fleet", "show", str(fleet)], cwd=ROOT)
    with tempfile.TemporaryDirectory(prefix="theseus-fleet-") as tmp:
        new = Path(tmp) / "ship"
        shutil.copytree(fleet, new)
        plan = new / "ship_load.json"
        doc = json.loads(plan.read_text())
        for node in doc["nodes"]:
            for agg in node.get("aggregates", []):
                if agg["name"] == "capacity":
                    agg["name"] = "max_capacity"
            if node["id"] == "over_capacity":
                node["predicate"] = "load > max_capacity * 0.9"
        plan.write_text(json.dumps(doc, indent=2) + "\n")
        print("\n== the ship-load query renames its output column 'capacity' to "
              "'max_capacity' ==")
        print("$ theseus fleet check fixtures/fleets/ship <the fleet with that change>")
        subprocess.run(THESEUS + ["fleet", "check", str(fleet), str(new)], cwd=ROOT)
        out = subprocess.run(THESEUS + ["fleet", "check", str(fleet), str(new), "--format",
                                        "json"], capture_output=True, text=True, cwd=ROOT)
    report = json.loads(out.stdout)
    by_query = {q["query"]: q for q in report["queries"]}
    pager = by_query["overload_pager"]
    hit = [f["code"] for f in pager["findings"] if f["effect"] == "unsupported"]
    ok = (report["verdict"] == "unsupported" and out.returncode == 3
          and by_query["ship_load"]["verdict"] != "unsupported"
          and "upstream-column-removed" in hit and pager["caused_by"] == ["ship_load"])
    print("fleet: the impact lands on overload_pager, caused by ship_load: "
          + ("as expected" if ok else f"UNEXPECTED: {json.dumps(report)[:600]}"))
    return 0 if ok else 1


def broker_running() -> bool:
    """Whether the local broker of ``scripts/kafka.sh`` runs (``status`` exits 0)."""
    r = subprocess.run(["bash", str(ROOT / "scripts" / "kafka.sh"), "status"],
                       capture_output=True, text=True, cwd=ROOT)
    return r.returncode == 0


def broker_part(ran_before: bool) -> None:
    """The demo's last lines say what became of the broker: the one it started is stopped
    (``make kafka`` starts one to keep); one that ran before it is left running, and they
    say how to stop it."""
    if os.environ.get("KAFKA_BOOTSTRAP"):
        print(f"\nkafka: the demo used the broker at $KAFKA_BOOTSTRAP "
              f"({os.environ['KAFKA_BOOTSTRAP']}), left as it was")
    elif ran_before:
        print("\nkafka: the local broker was running before the demo and is still running; "
              "`make kafka-stop` stops it")
    elif broker_running():
        r = subprocess.run(["bash", str(ROOT / "scripts" / "kafka.sh"), "stop"], cwd=ROOT,
                           capture_output=True, text=True)
        if r.returncode == 0 and not broker_running():
            print("\nkafka: stopped the local broker the demo started "
                  "(`make kafka` starts one to keep)")
        else:
            print("\nkafka: the local broker the demo started is STILL RUNNING (stopping it "
                  "failed: " + (r.stderr.strip().splitlines() or ["?"])[-1] + "); "
                  "`make kafka-stop` stops it")
    else:
        print("\nkafka: no local broker is left running")


def main() -> int:
    ran_before = not os.environ.get("KAFKA_BOOTSTRAP") and broker_running()
    rc = checker_part()
    rc = fleet_part() or rc
    try:
        for part in ("demo_run.py", "demo_migrate.py"):
            r = subprocess.run([sys.executable, str(ROOT / "scripts" / part)], cwd=ROOT)
            rc = r.returncode or rc
    finally:
        broker_part(ran_before)
    return rc


if __name__ == "__main__":
    sys.exit(main())
