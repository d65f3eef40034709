"""The drivers the tests start map the class-data-sharing archive of Spark's classes
(``jvm_archive``): Spark's classes come from the archive, not from its jars. A JVM that
cannot use an archive starts without it and says nothing, so this is the one place that
would notice (a JDK update, a changed class path, a stale archive)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.integration import jvm_archive
from tests.integration.conftest import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.own_jvm]


def test_a_test_driver_loads_sparks_classes_from_the_archive(kafka, driver_java_options,
                                                             tmp_path):
    assert "-XX:SharedArchiveFile=" in driver_java_options, \
        "no archive was made for the test drivers (see the first integration test's output)"
    src, out = kafka.topic(prefix="cds-in", partitions=2), kafka.topic(prefix="cds-out")
    kafka.produce(src, [{"k": f"k{i % 3}", "x": i} for i in range(20)])
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps(jvm_archive._plan("cds_check", src, out)))
    loads = tmp_path / "classes.log"
    env = dict(os.environ, THESEUS_SPARK_CONF=(
        f"spark.driver.extraJavaOptions={driver_java_options} "
        f"-Xlog:class+load=info:file={loads}"))
    r = subprocess.run([sys.executable, "-m", "migrate.cli", "run", str(plan), "--bootstrap",
                        kafka.bootstrap, "--state", str(tmp_path / "state"),
                        "--available-now"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    lines = loads.read_text().splitlines()
    # lambdas and generated classes are made at run time: never in an archive
    spark = [ln for ln in lines if " org.apache.spark." in ln and "$$Lambda" not in ln]
    shared = [ln for ln in spark if "source: shared objects file (top)" in ln]
    assert spark and len(shared) >= 0.8 * len(spark), \
        f"{len(shared)} of {len(spark)} Spark classes from the archive: {spark[:3]}"
    # the session, the streaming engine and the state store are among them
    for name in (".sql.classic.SparkSession ", ".MicroBatchExecution ",
                 ".state.RocksDBStateStoreProvider "):
        assert any(name in ln for ln in shared), name
