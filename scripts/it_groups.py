"""The integration test files in two groups for `make test` (stdout, one line, space
separated): ``serial``, the files in :data:`SERIAL` — live migrations (four to six Spark
drivers at once), fencing and leases, bounds on output gaps or progress sampled in
wall-clock time, installs — run one test at a time as before, first (the first test makes
the drivers' class-data-sharing archive, once per machine); ``parallel``, every other file
(an in-process Spark session per worker, or one driver in a subprocess: SIGKILL survival,
job files), run on two pytest-xdist workers, a file per worker at a time.

Every ``tests/integration/test_*.py`` is in exactly one group, so the two runs together run
every integration test, and CI's rule that a skipped or deselected one fails the run holds
in each.  Measured on the 2-core machine: four in-process files took 326 s one at a time and
209 s on two workers (bench/results/ci_time.md)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / "tests" / "integration"
#: run one test at a time: several drivers per test, or an assertion on wall-clock time
SERIAL = frozenset({
    "test_avro_migration.py", "test_cascade.py", "test_cascade_more.py",
    "test_checkpoint_migrate_tws.py", "test_fencing.py", "test_guards.py",
    "test_install.py", "test_jobs_run.py", "test_jvm_archive.py", "test_migration.py",
    "test_reconcile.py", "test_recursion_migrate.py", "test_runtime_errors.py",
    "test_services_again.py", "test_store_kafka.py", "test_table_migration.py",
    "test_view.py",
})


def groups(folder: Path = HERE) -> dict[str, list[str]]:
    """``{"serial": [...], "parallel": [...]}``, paths relative to the repository, sorted."""
    root = folder.parents[1]
    out: dict[str, list[str]] = {"serial": [], "parallel": []}
    for f in sorted(folder.glob("test_*.py")):
        name = "serial" if f.name in SERIAL else "parallel"
        out[name].append(str(f.relative_to(root)))
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in ("serial", "parallel"):
        print("usage: python scripts/it_groups.py serial|parallel", file=sys.stderr)
        return 2
    print(" ".join(groups()[argv[0]]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
