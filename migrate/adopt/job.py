"""Running a job file's builder function: import the file, call ``FUNCTION(spark)``, get the
``DataStreamWriter`` it returns, without starting anything.

Importing runs the job's module (as its own tests would); every way it can fail is one
``JobError`` naming the file and, where Python can tell, the line.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import os
import sys
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compat.errors import JobError
from migrate.adopt.origins import Origins, record

#: the function a job file defines when ``FILE.py`` names none
DEFAULT_FUNCTION = "build"

_LOCK = threading.Lock()
_SESSION: Any = None
_COUNTER = 0


@dataclass
class Job:
    """What the job built: its writer, the file's text (for line numbers) and the name it
    was imported from."""

    file: str
    function: str
    source: str
    writer: Any
    spark: Any
    shuffle_partitions: int
    #: the local modules the import loaded (files outside the Python installation), for
    #: the import cache's key
    modules: list[str] = field(default_factory=list)
    #: the sources whose partition count step 5 asked the broker for (node, bootstrap,
    #: topic): an import cache hit asks again
    lookups: list[dict[str, Any]] = field(default_factory=list)
    #: where the job's DataFrame calls were written (``migrate.adopt.origins``)
    origins: Origins | None = None


def split_target(target: str) -> tuple[str, str]:
    """``FILE.py[:FUNCTION]`` -> (file, function)."""
    path, sep, fn = target.rpartition(":")
    if sep and path.lower().endswith(".py") and fn.isidentifier():
        return path, fn
    return target, DEFAULT_FUNCTION


def spark_session() -> Any:
    """One local Spark session for every import of this process, with Spark's Kafka
    connector on its class path (the analyzer needs it to resolve ``format("kafka")``).
    Nothing runs on it: jobs are analysed, never started."""
    global _SESSION
    if _SESSION is not None:
        return _SESSION
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from migrate.adopt.jars import avro_jars, connector_jars

    active = SparkSession.getActiveSession()
    if active is not None and _has_kafka(active):
        _SESSION = active
        return active
    jars = connector_jars()
    with contextlib.suppress(JobError):
        # from_avro/to_avro need spark-avro; without it a job that does not use them
        # still imports (one that does fails naming the missing jar)
        jars += avro_jars()
    try:
        _SESSION = _start(SparkSession, jars)
    except JobError:
        raise
    except Exception as e:  # no Java, a JVM that does not start...
        raise JobError("cannot start Spark to analyse the job", expected="a local Spark "
                       "(Java 17 or 21 on PATH or JAVA_HOME)", found=_describe(e)) from None
    if not _has_kafka(_SESSION):
        raise JobError("the Spark session has no Kafka connector", expected="Spark's "
                       "spark-sql-kafka-0-10 jars on its class path",
                       found="a session started without them (start theseus in its own "
                       "process)")
    return _SESSION


def _start(SparkSession: Any, jars: list[str]) -> Any:
    # The JVM's own start-up chatter (log4j profile, native-hadoop and incubator warnings)
    # would bury the one line theseus prints: the JVM gets a silent stderr.  Errors still
    # reach Python through py4j.
    saved = os.dup(2)
    quiet = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(quiet, 2)
        session = (SparkSession.builder.master("local[1]").appName("theseus-import")
                   .config("spark.jars", ",".join(jars))
                   .config("spark.ui.enabled", "false")
                   .config("spark.ui.showConsoleProgress", "false")
                   .config("spark.sql.session.timeZone", "UTC")
                   .getOrCreate())
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(quiet)
    session.sparkContext.setLogLevel("ERROR")
    return session


def _has_kafka(spark: Any) -> bool:
    try:
        return bool(spark._jvm.org.apache.spark.util.Utils.classIsLoadable(
            "org.apache.spark.sql.kafka010.KafkaSourceProvider"))
    except Exception:
        return False


def read_source(path: str, raw: bytes | None = None) -> str:
    try:
        data = raw if raw is not None else Path(path).read_bytes()
        return data.decode("utf-8-sig")
    except FileNotFoundError:
        raise JobError("file not found", file=path) from None
    except IsADirectoryError:
        raise JobError("is a directory, not a job file", file=path) from None
    except UnicodeDecodeError as e:
        raise JobError(f"not UTF-8 text (byte {e.start})", file=path) from None
    except OSError as e:
        raise JobError(f"cannot read file: {e.strerror}", file=path) from None


def _line_in(tb: Any, path: str) -> int | None:
    """The last line of ``path`` in a traceback (where the job's own code failed)."""
    want = os.path.realpath(path)
    line = None
    for frame in traceback.extract_tb(tb):
        if os.path.realpath(frame.filename) == want:
            line = frame.lineno
    return line


def _describe(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    first = text[0][:300] if text else ""
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def run_job(path: str, function: str = DEFAULT_FUNCTION) -> Job:
    """Import ``path`` and call ``function(spark)``; the writer it returns, or one error."""
    source = read_source(path)
    try:
        compile(source, path, "exec", ast.PyCF_ONLY_AST)
    except SyntaxError as e:
        raise JobError(f"the job file is not valid Python: {e.msg}", file=path,
                       line=e.lineno) from None
    spark = spark_session()
    # A job sets its own shuffle partitions (or keeps Spark's default): start from the
    # default for every job, read what it chose, then give the session its value back.
    previous = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.unset("spark.sql.shuffle.partitions")
    try:
        return _run(spark, path, function, source)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", previous)


def _run(spark: Any, path: str, function: str, source: str) -> Job:
    global _COUNTER
    folder = str(Path(path).resolve().parent)
    with _LOCK:
        _COUNTER += 1
        name = f"_theseus_job_{_COUNTER}"
    before = set(sys.modules)
    sys.path.insert(0, folder)
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise JobError("cannot import the job file", file=path,
                           expected="a Python file", found=repr(path))
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except BaseException as e:  # a job may even call sys.exit
            if isinstance(e, KeyboardInterrupt):
                raise
            raise JobError(f"the job file raised on import: {_describe(e)}", file=path,
                           line=_line_in(e.__traceback__, path)) from None
        fn = getattr(module, function, None)
        if not callable(fn):
            defined = sorted(n for n, v in vars(module).items()
                             if callable(v) and getattr(v, "__module__", None) == name)
            raise JobError(f"the job file has no function '{function}'", file=path,
                           expected=f"def {function}(spark) returning the query's "
                           "DataStreamWriter (or FILE.py:FUNCTION)",
                           found=", ".join(defined) or "no function")
        try:
            with record(spark) as origins:
                writer = fn(spark)
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt):
                raise
            raise JobError(f"{function}(spark) raised: {_describe(e)}", file=path,
                           line=_line_in(e.__traceback__, path)) from None
    finally:
        try:
            sys.path.remove(folder)
        except ValueError:
            pass
        # The job's local modules are forgotten: another revision of the same job (the
        # other side of a check) imports its own, and the next job that imports one loads
        # it again, so that its import sees (and the cache records) every local file.
        loaded = []
        for mod in set(sys.modules) - before:
            f = getattr(sys.modules[mod], "__file__", None) or ""
            real = os.path.realpath(f) if f else ""
            # a submodule of a package loaded before (pyspark.sql.window) is not the job's
            # even when its package lives outside site-packages (SPARK_HOME/python)
            outside = mod.partition(".")[0] in before
            if mod == name or real.startswith(folder + os.sep) or \
                    (not outside and _local(real)):
                del sys.modules[mod]
                if mod != name and real:
                    loaded.append(real)
    _check_writer(writer, path, function, source)
    parts = int(spark.conf.get("spark.sql.shuffle.partitions"))
    return Job(path, function, source, writer, spark, parts, modules=sorted(set(loaded)),
               origins=origins)


def _installed_roots() -> tuple[str, ...]:
    # Theseus's own packages too: installed editable they sit outside site-packages, and a
    # module of theirs loaded while a job runs must stay loaded (one class per type).
    own = Path(__file__).resolve().parents[2]
    roots = {os.path.realpath(p) + os.sep
             for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                       own / "compat", own / "migrate", own / "gates")}
    return tuple(sorted(roots))


def _local(real: str) -> bool:
    """Whether a loaded file is the user's code rather than the Python installation's
    (the standard library, site-packages, a user site): only the user's code is part of
    what the import cache keys on (the installed packages are PySpark's and Theseus's
    versions)."""
    if not real or not real.endswith(".py"):
        return False
    parts = real.split(os.sep)
    if "site-packages" in parts or "dist-packages" in parts:
        return False
    return not real.startswith(_installed_roots())


def _check_writer(writer: Any, path: str, function: str, source: str) -> None:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

    if isinstance(writer, DataStreamWriter):
        return
    what = type(writer).__name__ if writer is not None else "None"
    hint = None
    if isinstance(writer, DataFrame):
        hint = "Return df.writeStream.format('kafka')...: the writer, not the DataFrame"
    elif isinstance(writer, StreamingQuery):
        writer.stop()
        hint = "Return the writer without calling start(): nothing must run"
    raise JobError(f"{function}(spark) does not return a DataStreamWriter", file=path,
                   line=def_line(source, function), expected="a DataStreamWriter "
                   "(spark.readStream...writeStream.format('kafka')...)", found=what,
                   hint=hint)


def def_line(source: str, name: str) -> int | None:
    """The line of ``def name`` (or ``name = ...``) in the job's text."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node.lineno
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name
                                                for t in node.targets):
            return node.lineno
    return None


def call_line(source: str, *names: str) -> int | None:
    """The first line calling (or decorating with) one of ``names``: ``x.foreachBatch(...)``,
    ``@udf``, ``F.udf(...)``."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    lines = []
    for node in ast.walk(tree):
        target = node.func if isinstance(node, ast.Call) else node
        if isinstance(target, ast.Attribute) and target.attr in names:
            lines.append(node.lineno)
        elif isinstance(target, ast.Name) and target.id in names:
            lines.append(node.lineno)
    return min(lines) if lines else None


__all__ = ["DEFAULT_FUNCTION", "Job", "call_line", "def_line", "run_job", "spark_session",
           "split_target"]
