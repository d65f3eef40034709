"""Every frozen version of every plan-history case (fixtures/history/<case>/v<N>/) still
builds and produces its expected output on real Spark and Kafka, as ksqlDB's historical
plans do: a plan once deployed must stay runnable whatever the compiler does later."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_qtt import assert_output, finished, start_cases

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = sorted(v for c in (ROOT / "fixtures" / "history").iterdir() if c.is_dir()
                  for v in c.iterdir() if v.is_dir() and v.name.startswith("v"))

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def history_runs(kafka, spark, tmp_path_factory):
    yield from start_cases(VERSIONS, kafka, tmp_path_factory)


@pytest.mark.parametrize("version", VERSIONS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_historical_plan_still_runs(version, history_runs, kafka):
    records, expected = finished(history_runs, version, kafka)
    assert_output(records, expected)
