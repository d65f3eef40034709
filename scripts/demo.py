"""`make demo`: the main job end to end on the embedded defaults.

Part 1 (checker): every upgrade pair under fixtures/upgrades/ goes through
`theseus check`; the verdicts are printed and compared with each pair's expect.json.
Part 2: scripts/demo_run.py (run on real Kafka); part 3: scripts/demo_migrate.py (live changes).
"""

from __future__ import annotations

import json
import subprocess
import sys
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


def main() -> int:
    rc = checker_part()
    for part in ("demo_run.py", "demo_migrate.py"):
        r = subprocess.run([sys.executable, str(ROOT / "scripts" / part)], cwd=ROOT)
        rc = r.returncode or rc
    return rc


if __name__ == "__main__":
    sys.exit(main())
