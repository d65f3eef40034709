"""Files that other processes read while they are being written: every write is atomic.

One function for the whole project (the store's records, gate state and acknowledgements,
start gates, the Kafka store's mirror): write a temporary file in the same directory, fsync
it, rename it over the target.  A reader sees the old content or the new, never half of it;
a crash leaves at most a temporary dot file (``.<name>.<random>.tmp``), which readers and the
Kafka store's mirror ignore.

A migrator guards every file it writes with its lease (:func:`guarded`): each write of its
thread is made under the guard, which refuses it once the lease is another owner's.

Standard library and ``compat.errors`` only, so that ``gates`` and ``migrate`` both import it.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from compat.errors import GateStateError, StoreError

_GUARD = threading.local()


@contextmanager
def guarded(guard: Callable[[], AbstractContextManager[Any]] | None) -> Iterator[None]:
    """Every :func:`atomic_write` of this thread runs inside ``guard()`` (a migrator's lease:
    it checks, under the lease's lock, that the lease is still this process's); None: the
    lease's own writes (it is the guard).  Threads of its own (the Kafka store's mirror
    applying other hosts' writes) are not guarded."""
    before = getattr(_GUARD, "guard", None)
    _GUARD.guard = guard
    try:
        yield
    finally:
        _GUARD.guard = before


def atomic_write(path: str | os.PathLike[str], text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) atomically; raises StoreError naming the file."""
    guard = getattr(_GUARD, "guard", None)
    with guard() if guard is not None else nullcontext():
        _write(Path(path), text)


def atomic_remove(path: str | os.PathLike[str]) -> None:
    """Remove ``path`` (gone already is fine), under the same guard as a write."""
    guard = getattr(_GUARD, "guard", None)
    with guard() if guard is not None else nullcontext():
        Path(path).unlink(missing_ok=True)


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise StoreError(f"cannot write the file: {e.strerror or e}", file=str(path)) from e
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError):
            raise StoreError(f"cannot write the file: {e.strerror or e}",
                             file=str(path)) from e
        raise


def atomic_write_json(path: str | os.PathLike[str], doc: Any, indent: int | None = 1) -> None:
    """:func:`atomic_write` of ``doc`` as JSON (serialized first: a document that is not
    JSON fails before any file is touched)."""
    atomic_write(path, json.dumps(doc, indent=indent) + "\n")


def read_json(path: str | os.PathLike[str], what: str) -> Any | None:
    """The JSON document at ``path``, None when there is no such file; one that does not
    parse is one :class:`~compat.errors.GateStateError` ("unreadable ``what``") naming it."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise GateStateError(f"unreadable {what}", file=str(path), expected="a JSON object",
                             found=str(e)) from None
    if doc is None:  # the file says null: not the same as no file
        raise GateStateError(f"malformed {what}", file=str(path), pointer="",
                             expected="a JSON object", found="null")
    return doc
