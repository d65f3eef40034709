"""The ANSI table of tests/test_ansi_types.py against a real Spark: every row Theseus accepts
Spark analyses, every row Theseus refuses (and every known gap) Spark refuses too, under the
session's default ``spark.sql.ansi.enabled`` (true in Spark 4)."""

from __future__ import annotations

import pytest

from tests.test_ansi_types import COLUMNS, GAPS, SPARK_ACCEPTS, SPARK_REFUSES

pytestmark = pytest.mark.integration


def _query(kind: str, text: str) -> str:
    if kind == "where":
        return f"SELECT * FROM theseus_ansi WHERE {text}"
    return f"SELECT {text} AS x FROM theseus_ansi"


def _outcomes(spark, rows) -> dict[str, str]:
    """Each row's Spark type ('where' rows: 'ok'), or 'refused'."""
    values = ", ".join(lit for _, _, lit in COLUMNS)
    names = ", ".join(n for n, _, _ in COLUMNS)
    spark.sql(f"CREATE OR REPLACE TEMP VIEW theseus_ansi AS SELECT * FROM VALUES ({values}) "
              f"AS t({names})")
    out = {}
    for kind, text, _ in rows:
        try:
            df = spark.sql(_query(kind, text))
            out[f"{kind}:{text}"] = "ok" if kind == "where" else \
                df.schema["x"].dataType.simpleString()
        except Exception:  # noqa: BLE001 - a parse or analysis error is a refusal
            out[f"{kind}:{text}"] = "refused"
    return out


def test_spark_is_in_ansi_mode(spark):
    assert spark.conf.get("spark.sql.ansi.enabled") == "true"


def test_spark_accepts_the_accepted_rows_with_their_types(spark):
    got = _outcomes(spark, SPARK_ACCEPTS)
    expected = {f"{k}:{t}": ("ok" if k == "where" else ty) for k, t, ty in SPARK_ACCEPTS}
    assert got == expected


def test_spark_refuses_the_refused_rows_and_the_gaps(spark):
    got = _outcomes(spark, SPARK_REFUSES + GAPS)
    assert {k: v for k, v in got.items() if v != "refused"} == {}
