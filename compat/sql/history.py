"""Plan history, as ksqlDB's query translation tests keep it.

``fixtures/history/<case>/<version>/`` holds one frozen version of a case::

    query.sql       the SQL as it was compiled
    plan.json       the plan the compiler produced from it (byte for byte)
    input.json      reference input records per source topic
    expected.json   expected output records (``compare``: ``multiset`` or ``table``)
    spec.json       {"version", "compiler", "theseus"}

Versions are ``v1``, ``v2``, … and are never edited: a plan that was once deployed must stay
buildable and keep producing its expected output, whatever the compiler does later.  The
latest version's SQL is the case's SQL today.  To change a case, put the new ``query.sql``
(and, if they change, ``input.json`` / ``expected.json``) in the case directory itself: that
is a draft, and :func:`freeze` turns it into the next version.

Two checks keep the history honest (both run in ``make test``):

1. compiling each case's SQL today gives its latest plan byte for byte — otherwise the
   compiler changed how it compiles (or a draft waits), and ``theseus plan freeze`` must
   record a new version;
2. every version's plan still builds and produces its expected output on real Spark and
   Kafka (tests/integration/test_history.py).
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from compat.errors import TheseusError

FILES = ("query.sql", "input.json", "expected.json")
_VERSION = re.compile(r"^v(\d+)$")


class HistoryError(TheseusError):
    """A history case is incomplete or malformed."""


@dataclass(frozen=True)
class Outcome:
    case: str
    status: str  # "unchanged", "new version", "would change"
    version: str | None
    reason: str = ""

    def line(self) -> str:
        text = f"{self.case}: {self.status}"
        if self.version:
            text += f" ({self.version})"
        return text + (f": {self.reason}" if self.reason else "")


def versions(case: Path) -> list[Path]:
    """The case's version directories, oldest first."""
    found = [(int(m.group(1)), p) for p in case.iterdir()
             if p.is_dir() and (m := _VERSION.match(p.name))]
    return [p for _, p in sorted(found)]


def cases(root: Path) -> list[Path]:
    if not root.is_dir():
        raise HistoryError("no history directory", file=str(root),
                           expected="a directory of cases", found="nothing")
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def _draft(case: Path) -> dict[str, Path]:
    return {f: case / f for f in FILES if (case / f).is_file()}


def source_files(case: Path) -> dict[str, Path]:
    """Where the case's SQL, input and expected output are today: a draft in the case
    directory overrides the latest version, file by file."""
    vs = versions(case)
    files = {f: vs[-1] / f for f in FILES} if vs else {}
    files.update(_draft(case))
    missing = [f for f in FILES if f not in files or not files[f].is_file()]
    if missing:
        raise HistoryError("history case is incomplete", file=str(case),
                           expected=", ".join(FILES), found="no " + ", ".join(missing),
                           hint="write them in the case directory and run theseus plan freeze")
    return files


def compile_case(case: Path) -> str:
    """The plan text the compiler gives today for the case's SQL."""
    from compat.sql import compile_file, dumps

    return dumps(compile_file(str(source_files(case)["query.sql"])))


def status(case: Path) -> Outcome:
    """Whether the case's latest version is what compiling its SQL gives today."""
    return _status(case, compile_case(case))


def _status(case: Path, text: str) -> Outcome:
    vs = versions(case)
    draft = _draft(case)
    if not vs:
        return Outcome(case.name, "would change", None, "no version yet")
    latest = vs[-1]
    if draft:
        changed = [f for f, p in draft.items() if p.read_bytes() != (latest / f).read_bytes()]
        if changed:
            return Outcome(case.name, "would change", latest.name,
                           "draft " + ", ".join(changed) + " in the case directory")
    plan = latest / "plan.json"
    if not plan.is_file() or plan.read_bytes() != text.encode("utf-8"):
        return Outcome(case.name, "would change", latest.name,
                       "compiling its SQL today gives a different plan")
    return Outcome(case.name, "unchanged", latest.name)


def freeze(case: Path, *, check: bool = False) -> Outcome:
    """Record a new version of ``case`` when compiling its SQL today differs from its latest
    plan, or when a draft waits in the case directory; with ``check``, only say so."""
    if not case.is_dir():
        raise HistoryError("no such history case", file=str(case),
                           expected="a case directory", found="nothing")
    try:
        return _freeze(case, check)
    except OSError as e:  # a file that cannot be read or written (permissions, disk full)
        raise HistoryError(f"cannot read or write the history: {e.strerror}",
                           file=str(e.filename or case)) from None


def _freeze(case: Path, check: bool) -> Outcome:
    text = compile_case(case)
    st = _status(case, text)
    if st.status == "unchanged":
        for p in _draft(case).values():  # a draft equal to the latest version: nothing new
            if not check:
                p.unlink()
        return st
    if check:
        return st
    files = source_files(case)
    vs = versions(case)
    n = int(_VERSION.match(vs[-1].name).group(1)) + 1 if vs else 1  # type: ignore[union-attr]
    target = case / f"v{n}"
    tmp = case / f".v{n}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    for f, src in files.items():
        shutil.copyfile(src, tmp / f)
    (tmp / "plan.json").write_text(text, encoding="utf-8")
    from compat.sql import COMPILER_VERSION

    spec = {"version": n, "compiler": COMPILER_VERSION, "theseus": _theseus_version()}
    (tmp / "spec.json").write_text(json.dumps(spec, indent=2) + "\n", encoding="utf-8")
    tmp.rename(target)
    for p in _draft(case).values():
        p.unlink()
    return Outcome(case.name, "new version", target.name, st.reason)


def _theseus_version() -> str:
    try:
        from importlib.metadata import version

        return version("theseus")
    except Exception:  # not installed (running from a checkout)
        return "unknown"
