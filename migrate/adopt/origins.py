"""Where a job's DataFrame calls were written: the file, line and column of the user's call
that made each DataFrame, so that findings on an imported job point at Python lines.

While the job's builder function runs (``record`` around ``FUNCTION(spark)``), PySpark's
DataFrame-making methods are wrapped.  A call made from outside PySpark records, for the
DataFrame it returns, the innermost frame of the user's code on the stack: PySpark, py4j,
Theseus, the standard library and installed packages are skipped, so a job's own helper
module is named but a shared library it calls is not.  Calls PySpark makes to itself (a
method built on another) record nothing: their DataFrames belong to the user's call.

The DataFrames are keyed by their analyzed plan, by JVM identity: Spark analyses each
DataFrame as it is made, and a DataFrame built on another keeps that analyzed tree as its
child (the same object), so the translator finds the user's call of every operator it
reads by looking its node up (``Origins.at``).  An operator no call returned (the join
under the projection of ``join(other, "k")``) takes the origin of the nearest operator
above it that has one.

An origin is written into the plan as the node's ``x-origin`` key: ``{"file": ...,
"line": ..., "column": ...}``, the file relative to the job file's folder (a plan imported
from the same bytes is the same wherever the checkout lives).  The serde keeps ``x-`` keys
and the checker ignores them (``compat.model.Node.extras``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

#: the node key an origin is written under
KEY = "x-origin"


@dataclass(frozen=True)
class Origin:
    """A call site: the file (absolute), 1-based line and column where Python places the
    call (the method's name in a chain spread over lines, the receiver's start in one)."""

    file: str
    line: int
    column: int

    def doc(self, folder: str) -> dict[str, Any]:
        """The ``x-origin`` value: the file relative to ``folder`` (the job's), posix."""
        rel = os.path.relpath(self.file, folder)
        return {"file": Path(rel).as_posix(), "line": self.line, "column": self.column}


@dataclass
class Origins:
    """What ``record`` saw: the origin of every DataFrame the user's code made, and of the
    writer's ``writeStream`` and ``option('topic', ...)`` calls."""

    ids: Any = None  # a java.util.IdentityHashMap of analyzed plans -> index in ``calls``
    calls: list[Origin] = field(default_factory=list)
    writer: Origin | None = None
    topic: Origin | None = None

    def at(self, plan: Any) -> Origin | None:
        """The origin of the call whose DataFrame has ``plan`` as its analyzed plan."""
        if self.ids is None:
            return None
        i = self.ids.get(plan)
        return self.calls[int(i)] if i is not None else None

    @property
    def sink(self) -> Origin | None:
        return self.topic or self.writer


def _roots() -> tuple[str, ...]:
    """Folders whose code is not the user's."""
    import py4j
    import pyspark

    here = Path(__file__).resolve().parents[2]  # the folder holding compat/, migrate/
    roots = [os.path.dirname(pyspark.__file__), os.path.dirname(py4j.__file__),
             *(str(here / p) for p in ("compat", "migrate", "gates"))]
    paths = sysconfig.get_paths()
    roots += [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths]
    return tuple(os.path.realpath(r) + os.sep for r in dict.fromkeys(roots))


@functools.lru_cache(maxsize=4096)
def _internal(filename: str, roots: tuple[str, ...]) -> bool:
    if filename.startswith("<"):  # <frozen ...>, <string>: nothing a reader can open
        return True
    return os.path.realpath(filename).startswith(roots)


def user_frame(frame: FrameType | None, roots: tuple[str, ...]) -> Origin | None:
    """The innermost frame at or above ``frame`` that is the user's code, as an origin."""
    while frame is not None:
        code = frame.f_code
        if not _internal(code.co_filename, roots):
            return _origin(frame)
        frame = frame.f_back
    return None


def _origin(frame: FrameType) -> Origin:
    # The position of the instruction running in the frame is the call's: for a call in
    # a chain spread over lines (``df\n .where(...)``) it starts at the method's name,
    # where f_lineno alone gives the same line but no column.
    line, col = frame.f_lineno, 0
    try:
        pos = list(frame.f_code.co_positions())[frame.f_lasti // 2]
        if pos[0] is not None:
            line, col = pos[0], pos[2] or 0
    except (IndexError, AttributeError):
        pass
    return Origin(os.path.realpath(frame.f_code.co_filename), line, col + 1)


def _classes() -> list[tuple[type, tuple[str, ...]]]:
    """The PySpark classes whose methods make DataFrames or set the sink, with the
    properties of theirs to wrap too."""
    from pyspark.sql import GroupedData, SparkSession
    from pyspark.sql.readwriter import DataFrameReader
    from pyspark.sql.streaming.readwriter import DataStreamReader, DataStreamWriter

    try:
        from pyspark.sql.classic.dataframe import DataFrame, DataFrameNaFunctions
    except ImportError:  # PySpark before 4: one DataFrame class
        from pyspark.sql.dataframe import DataFrame, DataFrameNaFunctions
    return [(DataFrame, ("writeStream",)), (GroupedData, ()), (DataFrameNaFunctions, ()),
            (DataStreamReader, ()), (DataFrameReader, ()), (SparkSession, ()),
            (DataStreamWriter, ())]


@contextlib.contextmanager
def record(spark: Any) -> Iterator[Origins]:
    """Record the origins of the DataFrames made while the block runs (one job's builder
    function); every wrapped method is restored on exit."""
    found = Origins(ids=spark._jvm.java.util.IdentityHashMap())
    roots = _roots()
    saved: list[tuple[type, str, Any]] = []

    def note(out: Any, name: str, args: tuple[Any, ...], caller: FrameType | None) -> None:
        if caller is None or _internal(caller.f_code.co_filename, roots[:2]):
            return  # PySpark calling itself: the DataFrame is the user's outer call's
        where = user_frame(caller, roots)
        if where is None:
            return
        jdf = getattr(out, "_jdf", None)
        if jdf is not None:
            qe = jdf.queryExecution()
            i = len(found.calls)
            found.calls.append(where)
            for plan in (qe.analyzed(), jdf.logicalPlan()):
                found.ids.putIfAbsent(plan, i)
        elif name == "writeStream":
            found.writer = where
        elif name == "option" and args and str(args[0]).lower() == "topic":
            found.topic = where

    def wrap(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            try:
                note(out, name, args[1:], sys._getframe(1))
            except Exception:  # noqa: BLE001 - an origin is a hint; the import goes on
                pass
            return out
        return wrapper

    for cls, props in _classes():
        for name in dir(cls):
            attr = inspect.getattr_static(cls, name)
            if name.startswith("_") or not inspect.isfunction(attr):
                if name in props and isinstance(attr, property) and attr.fget is not None:
                    saved.append((cls, name, cls.__dict__.get(name)))
                    setattr(cls, name, property(wrap(attr.fget, name)))
                continue
            saved.append((cls, name, cls.__dict__.get(name)))
            setattr(cls, name, wrap(attr, name))
    try:
        yield found
    finally:
        for cls, name, before in reversed(saved):
            if before is None:
                delattr(cls, name)
            else:
                setattr(cls, name, before)


__all__ = ["KEY", "Origin", "Origins", "record", "user_frame"]
