"""Spark's own Kafka connector (``spark-sql-kafka-0-10`` and the Kafka client it needs) and its
Avro functions (``spark-avro``: ``from_avro``/``to_avro``), as jars from Maven Central, fetched
once with ``mvn`` and cached.

``theseus plan import`` needs it to analyse a job's ``format("kafka")`` (the connector
resolves the source's columns); the faithfulness tests and ``bench/run_speed.py`` run jobs
with it; ``bench/avro_speed.py`` and jobs that use ``from_avro`` need ``spark-avro`` too.
Their version follows the installed PySpark; when Maven Central has none of that version yet,
the pom's default (the newest one that has) is used.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from compat.errors import JobError

#: the checkout this module runs from, if it does (the jars are cached there, in .cache/)
ROOT = Path(__file__).resolve().parents[2]
#: the pom that fetches the connector: package data, read as a resource (installed, the
#: package may not even be a folder) and written into the cache folder, where mvn runs it
POM = "spark-kafka.pom.xml"
#: the jars the connector needs at run time (Spark brings the rest)
PREFIXES = ("spark-sql-kafka-0-10", "spark-token-provider-kafka-0-10", "kafka-clients",
            "commons-pool2")
#: the connector version of the pom (used when the installed PySpark's is not published)
FALLBACK = "4.2.0"
#: spark-avro's pom, and the jars it brings that Spark does not (Avro itself comes with it)
AVRO_POM = "spark-avro.pom.xml"
AVRO_PREFIXES = ("spark-avro", "xz", "scala-parallel-collections")


def cache_dir() -> Path:
    """``$THESEUS_SPARK_KAFKA_JARS``, else ``.cache/spark-kafka`` in the checkout when
    Theseus runs from one, else ``theseus/spark-kafka`` in the user's cache folder
    (``$XDG_CACHE_HOME``, default ``~/.cache``): never inside an installed package."""
    env = os.environ.get("THESEUS_SPARK_KAFKA_JARS")
    if env:
        return Path(env)
    if (ROOT / "pyproject.toml").is_file() and (ROOT / "compat").is_dir():
        return ROOT / ".cache" / "spark-kafka"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "theseus" / "spark-kafka"


def _pom(cache: Path, name: str = POM) -> Path:
    """The pom ``name``, written into ``cache`` (mvn runs it there)."""
    from importlib import resources

    text = resources.files("migrate.adopt").joinpath(name).read_text(encoding="utf-8")
    path = cache / name
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
    return path


def _cached(cache: Path, artifact: str, versions: list[str]) -> str | None:
    for v in versions:
        if (cache / f"{artifact}_2.13-{v}.jar").exists():
            return v
    return None


def connector_jars(spark_version: str | None = None) -> list[str]:
    """The connector's jars for ``spark_version`` (default: the installed PySpark's),
    fetched into the cache when missing."""
    return _jars(POM, "spark-sql-kafka-0-10", PREFIXES, "Spark's Kafka connector",
                 spark_version)


def avro_jars(spark_version: str | None = None) -> list[str]:
    """``spark-avro``'s jars (``from_avro``/``to_avro``) for ``spark_version``, as
    :func:`connector_jars`."""
    return _jars(AVRO_POM, "spark-avro", AVRO_PREFIXES, "Spark's Avro functions (spark-avro)",
                 spark_version)


def _jars(pom: str, artifact: str, prefixes: tuple[str, ...], what: str,
          spark_version: str | None) -> list[str]:
    if spark_version is None:
        from importlib.metadata import version

        spark_version = version("pyspark")
    cache = cache_dir()
    versions = list(dict.fromkeys([spark_version, FALLBACK]))
    found = _cached(cache, artifact, versions)
    if found is None:
        errors = []
        for v in versions:
            r = _fetch(cache, v, pom)
            if r is None:
                found = v
                break
            errors.append(r)
        if found is None:
            raise JobError(f"cannot fetch {what} from Maven Central", file=str(cache / pom),
                           expected="mvn on PATH and Maven Central reachable "
                           f"(or the jars in {cache}, or $THESEUS_SPARK_KAFKA_JARS)",
                           found=errors[-1])
    return sorted(str(j) for j in cache.glob("*.jar")
                  if j.name.startswith(prefixes) and _version_ok(j.name, found))


def _version_ok(name: str, version: str) -> bool:
    """Spark's own jars of another version than the one chosen are left out."""
    if name.startswith(("spark-sql-kafka", "spark-token-provider", "spark-avro")):
        return name.endswith(f"-{version}.jar")
    return True


def _fetch(cache: Path, version: str, pom_name: str = POM) -> str | None:
    """Copy the artifact of ``pom_name`` at ``version`` and its dependencies into
    ``cache``; None when done, else what went wrong."""
    cache.mkdir(parents=True, exist_ok=True)
    pom = _pom(cache, pom_name)
    try:
        r = subprocess.run(["mvn", "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
                            f"-Dspark.version={version}", f"-DoutputDirectory={cache}"],
                           capture_output=True, text=True, timeout=600)
    except FileNotFoundError:
        return "no mvn on PATH"
    except subprocess.TimeoutExpired:
        return "mvn did not finish within 600 s"
    if r.returncode != 0:
        lines = [ln for ln in (r.stdout + r.stderr).splitlines() if "ERROR" in ln]
        return (lines[0] if lines else f"mvn exit {r.returncode}")[:300]
    return None


__all__ = ["avro_jars", "connector_jars", "cache_dir"]
