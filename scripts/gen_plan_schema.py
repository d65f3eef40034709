"""Writes compat/schemas/plan.v1.json from the step classes (``compat.plan_schema``).

Run after adding or changing a step type: ``python scripts/gen_plan_schema.py``; a test fails
while the committed schema is stale."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from compat.plan_schema import plan_schema  # noqa: E402


def render() -> str:
    return json.dumps(plan_schema(), indent=2) + "\n"


if __name__ == "__main__":
    out = ROOT / "compat" / "schemas" / "plan.v1.json"
    out.write_text(render())
    print(f"wrote {out}")
