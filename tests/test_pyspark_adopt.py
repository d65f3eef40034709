"""The parts of ``theseus plan import`` that need no Spark: durations, the job target,
line numbers found in the job's text, expression text clean-up.  (The importer itself runs
on real Spark: ``tests/integration/test_pyspark_import.py``.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from migrate.adopt.job import call_line, def_line, split_target
from migrate.adopt.translate import _unparen, duration

ROOT = Path(__file__).resolve().parents[1]
JOB = '''\
from pyspark.sql import functions as F

@F.udf("string")
def shout(s):
    return s.upper()

slug = F.udf(lambda s: s.lower())

def build(spark):
    df = spark.readStream.format("kafka").load()
    return df.writeStream.foreachBatch(print)
'''


def test_durations_take_the_largest_exact_unit():
    assert duration(60_000_000) == "1 minute"
    assert duration(120_000_000) == "2 minutes"
    assert duration(90_000_000) == "90 seconds"
    assert duration(3_600_000_000) == "1 hour"
    assert duration(86_400_000_000 * 2) == "2 days"
    assert duration(1500) == "1500 microseconds"
    assert duration(2000) == "2 milliseconds"


def test_target_names_the_function_after_a_colon():
    assert split_target("jobs/a.py") == ("jobs/a.py", "build")
    assert split_target("jobs/a.py:make_v2") == ("jobs/a.py", "make_v2")
    assert split_target("C:/jobs/a.py") == ("C:/jobs/a.py", "build")


def test_lines_of_definitions_and_calls():
    assert def_line(JOB, "shout") == 4
    assert def_line(JOB, "slug") == 7
    assert def_line(JOB, "build") == 9
    assert call_line(JOB, "foreachBatch") == 11
    assert call_line(JOB, "udf") == 3  # the decorator
    assert call_line(JOB, "applyInPandasWithState") is None


def test_outer_parentheses_only_when_they_wrap_everything():
    assert _unparen("(a > 1)") == "a > 1"
    assert _unparen("((a > 1))") == "a > 1"
    assert _unparen("(a > 1) AND (b < 2)") == "(a > 1) AND (b < 2)"
    assert _unparen("a") == "a"


def test_importing_the_adopt_package_imports_no_spark():
    """PySpark is imported when a job is run, not when the CLI or compat load the
    importer's modules."""
    code = ("import sys, migrate.adopt, migrate.adopt.translate, compat.export\n"
            "print([m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    assert out.strip() == "[]", out


def test_an_interval_as_spark_writes_it_equals_the_users_spelling():
    """Spark's ``Expression.sql`` writes ``INTERVAL '01' HOUR`` where a plan says
    ``INTERVAL 1 HOURS``: an imported time bound must compare equal, a different one not."""
    from compat.expr import canonical

    assert canonical("b.ts <= a.ts + INTERVAL '01' HOUR") == \
        canonical("b.ts <= a.ts + INTERVAL 1 HOURS")
    assert canonical("b.ts BETWEEN a.ts AND (a.ts + INTERVAL '10' MINUTE)") == \
        canonical("b.ts BETWEEN a.ts AND a.ts + INTERVAL 10 MINUTES")
    assert canonical("a.ts + INTERVAL '10' MINUTE") != canonical("a.ts + INTERVAL 10 HOURS")
    # Spark writes a <> b as NOT (a = b)
    assert canonical("NOT (region = 'test')") == canonical("region <> 'test'")
    assert canonical("NOT (region = 'test')") != canonical("region = 'test'")
