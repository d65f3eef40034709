"""The type table of tests/test_types.py against a real Spark: ``DataType.fromDDL`` reads every
type there the way the table says (its ``simpleString``), and refuses every refused one."""

from __future__ import annotations

import pytest

from tests.test_types import SPARK_REFUSES, SPARK_TYPES

pytestmark = pytest.mark.integration


def test_spark_reads_the_table_as_it_says(spark):
    from pyspark.sql.types import DataType

    got = {text: DataType.fromDDL(text).simpleString() for text, _, _ in SPARK_TYPES}
    assert got == {text: simple for text, simple, _ in SPARK_TYPES}


def test_spark_refuses_what_theseus_refuses(spark):
    from pyspark.sql.types import DataType

    accepted = []
    for text in SPARK_REFUSES:
        try:
            accepted.append((text, DataType.fromDDL(text).simpleString()))
        except Exception:  # noqa: BLE001 - any parse error is a refusal
            pass
    assert accepted == []


def test_spark_reads_every_canonical_form(spark):
    # Compiled plans carry the canonical spelling, and Spark builds the query from the plan
    from pyspark.sql.types import DataType

    got = {canon: DataType.fromDDL(canon).simpleString().lower() for _, _, canon in SPARK_TYPES}
    # the same type, but for char/varchar (read as string) and quoting
    assert got == {canon: simple.lower().replace("varchar(10)", "string")
                   .replace("char(3)", "string")
                   for _, simple, canon in SPARK_TYPES}
