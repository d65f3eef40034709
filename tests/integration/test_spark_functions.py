"""compat/spark_functions.json is the installed Spark's list of built-in functions: generated
again from the session, it is the committed file, byte for byte."""

from __future__ import annotations

import pytest

from scripts.gen_spark_functions import OUT, render, spark_functions

pytestmark = pytest.mark.integration


def test_the_committed_function_list_is_current(spark):
    fresh = render(spark_functions(spark))
    assert fresh == OUT.read_text(), (
        "compat/spark_functions.json is stale: run `python scripts/gen_spark_functions.py`")
