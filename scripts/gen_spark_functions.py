"""Writes compat/spark_functions.json: the built-in functions of the installed PySpark.

Plans call Spark SQL functions by name; a name Spark does not know (``my_udf(amount)``) would
only fail when the query starts.  The checker must not import pyspark, so the list is kept
as data, generated here from a local SparkSession (``SHOW SYSTEM FUNCTIONS``: built-ins only,
never a session's temporary functions) and refreshed when PySpark is upgraded:

    PYSPARK_PYTHON=$PWD/.venv/bin/python SPARK_LOCAL_IP=127.0.0.1 \\
        .venv/bin/python scripts/gen_spark_functions.py

``tests/integration/test_spark_functions.py`` regenerates the list from Spark and fails while
the committed file differs.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "compat" / "spark_functions.json"

#: operators (``+``, ``<=>``, ``!``...) are listed too; plans write them as operators
_NAME = re.compile(r"[a-z_][a-z0-9_]*")


def spark_functions(spark: Any) -> dict[str, Any]:
    """The document the file holds, read from ``spark``."""
    names = sorted({row[0].lower() for row in spark.sql("SHOW SYSTEM FUNCTIONS").collect()
                    if _NAME.fullmatch(row[0].lower())})
    aggregates = sorted(
        f.name.lower() for f in spark.catalog.listFunctions()
        if f.name.lower() in names and f.className and
        (".aggregate." in f.className or f.className.endswith("Agg")))
    return {"spark_version": spark.version,
            "generated_by": "scripts/gen_spark_functions.py (SHOW SYSTEM FUNCTIONS)",
            "functions": names, "aggregates": aggregates}


def render(doc: dict[str, Any]) -> str:
    # One name per line: an upgrade of Spark shows as a readable diff.
    return json.dumps(doc, indent=1) + "\n"


def main() -> int:
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[1]").appName("gen-spark-functions")
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        doc = spark_functions(spark)
    finally:
        spark.stop()
    OUT.write_text(render(doc))
    print(f"wrote {OUT}: {len(doc['functions'])} functions "
          f"({len(doc['aggregates'])} aggregates) of Spark {doc['spark_version']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
