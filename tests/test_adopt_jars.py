"""migrate.adopt.jars without Maven: which cached jars Spark's Kafka connector and spark-avro
are, by version, and the one error when they are missing and cannot be fetched."""
from __future__ import annotations

from pathlib import Path

import pytest

from compat.errors import JobError
from migrate.adopt.jars import avro_jars, connector_jars

CACHED = ["spark-sql-kafka-0-10_2.13-4.2.0.jar", "spark-token-provider-kafka-0-10_2.13-4.2.0.jar",
          "spark-sql-kafka-0-10_2.13-4.1.0.jar", "kafka-clients-3.9.2.jar",
          "commons-pool2-2.13.1.jar", "spark-avro_2.13-4.2.0.jar", "spark-avro_2.13-4.1.0.jar",
          "xz-1.12.jar", "scala-parallel-collections_2.13-1.2.0.jar", "snappy-java-1.1.10.5.jar"]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    for name in CACHED:
        (tmp_path / name).write_bytes(b"")
    monkeypatch.setenv("THESEUS_SPARK_KAFKA_JARS", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # no mvn: nothing is fetched
    return tmp_path


def test_each_artifact_takes_its_own_jars_of_the_cached_version(cache):
    # 4.3.0 is not cached (nor fetchable here): the pom's default version is
    names = [Path(j).name for j in connector_jars("4.3.0")]
    assert names == ["commons-pool2-2.13.1.jar", "kafka-clients-3.9.2.jar",
                     "spark-sql-kafka-0-10_2.13-4.2.0.jar",
                     "spark-token-provider-kafka-0-10_2.13-4.2.0.jar"]
    names = [Path(j).name for j in avro_jars("4.1.0")]
    assert names == ["scala-parallel-collections_2.13-1.2.0.jar",
                     "spark-avro_2.13-4.1.0.jar", "xz-1.12.jar"]


def test_a_missing_artifact_without_mvn_is_one_error_naming_it(cache):
    (cache / "spark-avro_2.13-4.2.0.jar").unlink()
    with pytest.raises(JobError, match=r"cannot fetch Spark's Avro functions \(spark-avro\)") \
            as e:
        avro_jars("4.3.0")
    assert "no mvn on PATH" in str(e.value)
    assert (cache / "spark-avro.pom.xml").is_file()  # the pom mvn would have run
