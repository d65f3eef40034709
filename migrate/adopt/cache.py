"""The import cache: a job file's plan document, kept by content so that a job imported
before is not run under Spark again.

The key of an entry holds everything the document is made of that can be read without
running the job:

- the job file's bytes, the function called and the import's options;
- the PySpark and Theseus versions, and the bytes of the importer itself and of ``compat/``
  (the plan model, inference and serde the translation goes through): a checkout edited
  there changes what an import gives without changing the version;
- the values of the environment variables the job's text names (``os.environ.get("X")``,
  ``os.getenv("X")``, ``os.environ["X"]``): the fixtures' jobs take their topic prefix and
  broker from there.

The local modules a job imports (its sibling ``schemas.py``, a package of the repository)
are known only once it ran: an import records the files it actually loaded (the
``sys.modules`` difference, :func:`migrate.adopt.job.run_job`; an AST walk would miss
``importlib`` calls, conditional imports and what the helpers import in turn) with their
bytes' digests.  Several entries may share a key (the same job over two revisions of its
helper); one is used only when every file it records still has those bytes, so an edited
helper is a miss, never a stale plan.

Sources whose partition count came from the broker the job names (step 5 of the import)
are recorded and asked again on every hit, as a cold import would: the broker's answer is
not content.

The cache lives in ``$THESEUS_CACHE_DIR``, else ``$XDG_CACHE_HOME/theseus``, else
``~/.cache/theseus``; deleting it at any time is safe.  Entries are written to a temporary
file and renamed into place; one that cannot be read or does not hold what an entry holds
is ignored (and replaced by the next import).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import compat

#: bumped when an entry's layout changes: older entries are then simply never found
LAYOUT = 1
_ENV = re.compile(r"""(?:environ\.get|getenv|environ\.setdefault)\(\s*['"]([^'"]+)['"]"""
                  r"""|environ\[\s*['"]([^'"]+)['"]\s*\]""")
_IMPORTER = Path(__file__).resolve().parent
_COMPAT = Path(compat.__file__).resolve().parent


def cache_dir() -> Path:
    """Where entries are kept (see the module's docstring)."""
    own = os.environ.get("THESEUS_CACHE_DIR")
    if own:
        return Path(own)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "theseus"


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "none"


_TOOL: str | None = None


def tool_digest() -> str:
    """PySpark's and Theseus' versions and the importer's and ``compat/``'s sources, as one
    digest (computed once per process)."""
    global _TOOL
    if _TOOL is None:
        h = hashlib.sha256(f"layout {LAYOUT}\0pyspark {_version('pyspark')}\0"
                           f"theseus {_version('theseus')}\0".encode())
        for f in tool_files():
            name = f.relative_to(f.parent if f.parent == _IMPORTER else _COMPAT.parent)
            h.update(str(name).encode() + b"\0" + f.read_bytes() + b"\0")
        _TOOL = h.hexdigest()
    return _TOOL


def tool_files() -> list[Path]:
    """The sources an import's document is made by: the importer's modules, and
    ``compat/``'s modules and data (its JSON schemas and function list)."""
    own = sorted(_IMPORTER.glob("*.py"))
    model = sorted(f for f in _COMPAT.rglob("*") if f.suffix in (".py", ".json")
                   and "__pycache__" not in f.parts)
    return own + model


def env_names(text: bytes) -> list[str]:
    """The environment variables a job's (or module's) text reads by name."""
    found = _ENV.findall(text.decode("utf-8", errors="replace"))
    return sorted({a or b for a, b in found})


def job_key(source: bytes, function: str, options: dict[str, Any]) -> str:
    """The key of a job's entries: everything but its local modules."""
    h = hashlib.sha256(tool_digest().encode())
    h.update(b"\0function " + function.encode())
    h.update(b"\0options " + json.dumps(options, sort_keys=True).encode())
    for name in env_names(source):
        value = os.environ.get(name)
        h.update(f"\0env {name}=".encode() + (b"\1" + value.encode() if value is not None
                                             else b"\0"))
    h.update(b"\0job\0" + source)
    return h.hexdigest()


def digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def module_digests(job_path: str, files: list[str]) -> dict[str, str]:
    """``files`` (the local modules an import loaded) by the name an entry records: relative
    to the job's folder when inside it (the same job checked out elsewhere, as ``--against``
    does, finds its entries), absolute otherwise; each with its bytes' digest."""
    folder = Path(job_path).resolve().parent
    out: dict[str, str] = {}
    for f in files:
        p = Path(f).resolve()
        d = digest(p)
        if d is None:
            continue
        try:
            name = p.relative_to(folder).as_posix()
        except ValueError:
            name = str(p)
        out[name] = d
    return out


def _modules_match(job_path: str, modules: dict[str, str]) -> bool:
    folder = Path(job_path).resolve().parent
    for name, want in modules.items():
        p = Path(name) if os.path.isabs(name) else folder / name
        if digest(p) != want:
            return False
    return True


def _env_of_modules(job_path: str, modules: dict[str, str]) -> dict[str, str | None]:
    """The environment variables the modules name, with their current values (a helper
    that reads the prefix is as much the plan's input as the job)."""
    folder = Path(job_path).resolve().parent
    names: set[str] = set()
    for name in modules:
        p = Path(name) if os.path.isabs(name) else folder / name
        try:
            names.update(env_names(p.read_bytes()))
        except OSError:
            continue
    return {n: os.environ.get(n) for n in sorted(names)}


def _folder(key: str) -> Path:
    return cache_dir() / "imports" / key[:2] / key


def lookup(job_path: str, key: str) -> dict[str, Any] | None:
    """The entry of ``key`` whose recorded modules all still have their bytes (and the
    variables they read their values), or None.  Unreadable entries count as absent."""
    folder = _folder(key)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return None
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            entry = json.loads((folder / name).read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError, RecursionError):
            continue
        if not _valid(entry):
            continue
        if _modules_match(job_path, entry["modules"]) and \
                _env_of_modules(job_path, entry["modules"]) == entry["env"]:
            return entry
    return None


def _valid(entry: Any) -> bool:
    return (isinstance(entry, dict) and entry.get("layout") == LAYOUT
            and isinstance(entry.get("modules"), dict)
            and all(isinstance(k, str) and isinstance(v, str)
                    for k, v in entry["modules"].items())
            and isinstance(entry.get("env"), dict)
            and isinstance(entry.get("doc"), dict)
            and isinstance(entry.get("doc", {}).get("nodes"), list)
            and isinstance(entry.get("lookups"), list)
            and all(isinstance(x, dict) and isinstance(x.get("node"), str)
                    and isinstance(x.get("topic"), str) for x in entry["lookups"]))


def store(job_path: str, key: str, files: list[str], doc: dict[str, Any],
          lookups: list[dict[str, Any]]) -> None:
    """Record an import: written whole to a temporary file, then renamed, so a reader
    never sees half an entry.  A cache that cannot be written is no error: the import
    stands without it."""
    modules = module_digests(job_path, files)
    entry = {"layout": LAYOUT, "modules": modules,
             "env": _env_of_modules(job_path, modules), "lookups": lookups, "doc": doc}
    text = json.dumps(entry, sort_keys=True)
    name = hashlib.sha256(json.dumps([modules, entry["env"]], sort_keys=True).encode()
                          ).hexdigest()[:32] + ".json"
    folder = _folder(key)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, folder / name)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError:
        return


def resolve_lookups(doc: dict[str, Any], lookups: list[dict[str, Any]],
                    ask: Callable[[str | None, str], int | None]) -> dict[str, Any]:
    """``doc`` with the partitions of the sources that the broker gave asked again."""
    nodes = {n.get("id"): n for n in doc["nodes"] if isinstance(n, dict)}
    for x in lookups:
        node = nodes.get(x["node"])
        if node is not None:
            node["partitions"] = ask(x.get("bootstrap"), x["topic"]) or 1
    return doc


__all__ = ["cache_dir", "job_key", "lookup", "module_digests", "resolve_lookups", "store",
           "tool_digest"]
