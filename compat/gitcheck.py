"""``theseus check --against REF PATH...``: every plan under PATH against its version at a
git ref, as a pull-request job runs it.  One report for all files; the exit code is the
worst outcome (an invalid plan counts as worst: nothing can be said about it)."""

from __future__ import annotations

import ast
import json
import posixpath
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compat.check import Report, check_plans, is_job, is_sql, load_plan
from compat.errors import CheckError, TheseusError
from compat.loaders import defines_builder
from compat.model import Plan
from compat.origins import relocate

#: outcome -> (rank, exit code)
OUTCOMES = {"identical": (0, 0), "in_place": (1, 0), "new": (1, 0), "removed": (2, 1),
            "migrate": (3, 1), "unsupported": (4, 3), "invalid": (5, 2)}


@dataclass
class Entry:
    path: str
    outcome: str
    report: Report | None = None
    error: str | None = None
    #: where in the file the error is, when the reader knows it (a SQL script's line and
    #: column)
    line: int | None = None
    col: int | None = None


def git(args: list[str], cwd: Path) -> subprocess.CompletedProcess[bytes]:
    """``git ARGS`` in ``cwd``, its output captured; no git on PATH is one error."""
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, check=False)
    except FileNotFoundError:
        raise CheckError("git is not installed", expected="git on PATH",
                         found="no git") from None


#: plan files: JSON documents, Spark SQL scripts (compiled on the fly) and PySpark jobs
#: (imported on the fly)
SUFFIXES = (".json", ".sql", ".py")
#: a Theseus SQL script declares its topics as Kafka tables
_KAFKA_TABLE = re.compile(rb"\busing\s+kafka\b", re.IGNORECASE)


def _is_plan_text(raw: bytes, name: str) -> bool:
    """Whether a file under the checked paths is a plan: a JSON document of the plan
    format, or a SQL script that declares a Kafka table (other JSON and SQL files, such as
    reference data or batch jobs, are not plans and are left alone)."""
    if is_sql(name):
        return bool(_KAFKA_TABLE.search(raw))
    if is_job(name):
        return defines_builder(raw)  # a helper module the jobs import is left alone
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return True  # a broken .json under a plans folder is reported as invalid
    return isinstance(doc, dict) and str(doc.get("format", "")).startswith("theseus.plan/")


def collect(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            out.extend(sorted(f for f in path.rglob("*")
                              if f.suffix.lower() in SUFFIXES and f.is_file()))
        elif path.exists():
            out.append(path)
    return out


def _inside(path: Path, root: Path) -> str:
    """``path`` relative to the repository's top folder; a path outside it has no version
    at any ref, so it is refused rather than skipped."""
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        raise CheckError("path is outside the git repository", file=str(path),
                         expected=f"a path inside {root}",
                         found=str(path.resolve())) from None


def check_against(ref: str, paths: list[str], *, require: list[str] | None = None,
                  schema_compat: str = "forward", allow_migration: bool = False
                  ) -> list[Entry]:
    cwd = Path.cwd()
    top = git(["rev-parse", "--show-toplevel"], cwd)
    if top.returncode != 0:
        raise CheckError("not inside a git repository", found=str(cwd),
                         expected="a git work tree (for --against)")
    root = Path(top.stdout.decode().strip())
    if git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], cwd).returncode != 0:
        raise CheckError(f"git ref '{ref}' not found", expected="a branch, tag or commit",
                         found=repr(ref))
    rels = {p: _inside(Path(p), root) for p in paths}
    for p, rel in rels.items():
        if not Path(p).exists() and not _at_ref(ref, rel, root):
            raise CheckError(f"no such file or folder, in the work tree or at {ref}", file=p,
                             expected="a plan file or a folder of plans",
                             found="nothing at that path")
    entries: list[Entry] = []
    current = collect(paths)
    seen: set[str] = set()
    with RefTree(ref, root) as tree:
        _check_files(current, entries, seen, ref, root, tree, require, schema_compat,
                     allow_migration)
    # Plans that existed at REF under the same paths and are gone now.
    for p in paths:
        rel_dir = Path(p).resolve()
        try:
            rel = rel_dir.relative_to(root).as_posix()
        except ValueError:
            continue
        listing = git(["ls-tree", "-r", "--name-only", ref, "--", rel], root)
        for name in listing.stdout.decode().splitlines():
            if name.lower().endswith(SUFFIXES) and name not in seen and \
                    not (root / name).exists():
                blob = git(["show", f"{ref}:{name}"], root).stdout
                if _is_plan_text(blob, name):
                    seen.add(name)
                    entries.append(Entry(name, "removed", error=removed_error(name, ref)))
    # A path that holds no plan on either side would pass as "0 plans": a typo, or plans
    # the gate does not see; either way nothing was checked.
    for p, rel in rels.items():
        if not any(rel in (".", n) or n.startswith(rel + "/") for n in seen):
            raise CheckError(f"no plan here or at {ref}", file=p,
                             expected="*.json plans, *.sql scripts with Kafka tables or "
                             "PySpark jobs (*.py with build() and writeStream)",
                             found="none")
    return entries


def removed_error(name: str, ref: str) -> str:
    """What a removed plan fails the gate with (exit 1, also with --allow-migration), in
    every format: the merge does not stop the query that runs it."""
    return (f"{name}: the plan was removed (it exists at {ref}): removing it does not stop "
            "its running query, which keeps reading and writing; stop it by hand "
            "(theseus stop) when this change is deployed")


def _at_ref(ref: str, rel: str, root: Path) -> bool:
    """Whether ``rel`` (a file or folder) exists in the tree of ``ref``."""
    if rel == ".":
        return True
    return bool(git(["ls-tree", "--name-only", ref, "--", rel], root).stdout.strip())


class RefTree:
    """The repository at REF checked out in a temporary worktree, made on first use (only
    a job file needs it: a job imports its sibling modules, which must come from the same
    revision) and removed on exit."""

    def __init__(self, ref: str, root: Path) -> None:
        self.ref, self.root = ref, root
        self.path: Path | None = None
        self._tmp: str | None = None
        self._changed: set[str] | None = None

    def __enter__(self) -> RefTree:
        return self

    def changed(self) -> set[str]:
        """The files (relative to the repository's top) that differ between REF and the
        work tree, untracked ones included; asked of git once."""
        if self._changed is None:
            self._changed = changed_files(self.ref, self.root)
        return self._changed

    def file(self, rel: str) -> str:
        if self.path is None:
            import tempfile

            self._tmp = tempfile.mkdtemp(prefix="theseus-ref-")
            path = Path(self._tmp) / "tree"
            r = git(["worktree", "add", "--detach", "--quiet", str(path), self.ref],
                    self.root)
            if r.returncode != 0:
                raise CheckError(f"cannot check out git ref '{self.ref}' in a temporary "
                                 "worktree", expected="git worktree add to succeed",
                                 found=r.stderr.decode(errors="replace").strip()[:300])
            self.path = path
        return str(self.path / rel)

    def job(self, rel: str) -> Plan:
        """The job ``rel`` imported from the checkout, named ``REF:rel`` as a SQL script
        read at the ref is, its positions in the checkout's other files likewise."""
        path = self.file(rel)
        root = str(self.path)
        try:
            plan = load_plan(path)
        except TheseusError as e:  # an old job that does not import: named at the ref too
            if e.file and e.file.startswith(root + "/"):
                e.file = f"{self.ref}:{e.file[len(root) + 1:]}"
            raise
        return relocate(plan, f"{self.ref}:{rel}", root, f"{self.ref}:")

    def __exit__(self, *exc: object) -> None:
        if self.path is not None:
            git(["worktree", "remove", "--force", str(self.path)], self.root)
        if self._tmp is not None:
            import shutil

            shutil.rmtree(self._tmp, ignore_errors=True)
            git(["worktree", "prune"], self.root)


def _check_files(current: list[Path], entries: list[Entry], seen: set[str], ref: str,
                 root: Path, tree: RefTree, require: list[str] | None, schema_compat: str,
                 allow_migration: bool) -> None:
    for path in current:
        try:
            raw_new = path.read_bytes()
        except OSError as e:
            entries.append(Entry(str(path), "invalid",
                                 error=f"{path}: cannot read file: {e.strerror}"))
            continue
        if not _is_plan_text(raw_new, path.name):
            continue
        rel = path.resolve().relative_to(root).as_posix()
        seen.add(rel)
        old = git(["show", f"{ref}:{rel}"], root)
        try:
            if old.returncode != 0:
                load_plan(str(path))
                entries.append(Entry(str(path), "new"))
                continue
            if not _is_plan_text(old.stdout, rel):
                load_plan(str(path))
                entries.append(Entry(str(path), "new"))
                continue
            # Bytes first: a file equal in both trees is identical without being parsed,
            # compiled or imported (a job also needs the local modules it imports equal).
            if old.stdout == raw_new and (not is_job(rel) or
                                          job_deps_unchanged(rel, root, tree.changed())):
                entries.append(Entry(str(path), "identical"))
                continue
            # Both revisions are compiled when they are SQL: the old one from git's copy;
            # a job is imported from the ref's own tree (its sibling modules with it).
            old_plan = tree.job(rel) if is_job(rel) else \
                load_plan(f"{ref}:{rel}", raw=old.stdout)
            new_plan = load_plan(str(path), reuse=old_plan)
            report = check_plans(old_plan, new_plan, require=require,
                                 schema_compat=schema_compat,
                                 allow_migration=allow_migration)
            entries.append(Entry(str(path), report.verdict, report))
        except TheseusError as e:
            entries.append(Entry(str(path), "invalid", error=e.render(),
                                 line=getattr(e, "line", None), col=getattr(e, "col", None)))


def changed_files(ref: str, root: Path) -> set[str]:
    """The files (relative to the repository's top) that differ between ``ref`` and the
    work tree, untracked ones included."""
    diff = git(["diff", "--name-only", "-z", "--no-renames", ref, "--"], root)
    extra = git(["ls-files", "--others", "--exclude-standard", "-z"], root)
    if diff.returncode != 0 or extra.returncode != 0:
        raise CheckError(f"cannot compare the work tree with git ref '{ref}'",
                         expected="git diff to succeed",
                         found=(diff.stderr or extra.stderr).decode(
                             errors="replace").strip()[:300])
    return {n for out in (diff.stdout, extra.stdout)
            for n in out.decode(errors="surrogateescape").split("\0") if n}


def job_deps_unchanged(rel: str, root: Path, changed: set[str]) -> bool:
    """Whether no local module that the job ``rel`` may import changed.  A job imports from
    its own folder (``run_job`` puts it first on ``sys.path``); the modules it names are
    found by walking the ``import`` statements of the job and, through them, of the
    helpers it names (an AST walk: nothing is run, and it errs on the side of a change,
    since every name imported anywhere in a file counts).  Only a changed ``.py`` in the
    job's folder can make the answer no, so most checks read no helper at all."""
    folder = posixpath.dirname(rel)
    prefix = folder + "/" if folder else ""
    nearby = {c for c in changed if c.startswith(prefix) and c != rel
              and c.endswith((".py", ".pyi", ".pth", ".so"))}
    if not nearby:
        return True
    todo, seen = [rel], {rel}
    while todo:
        text = _read(root / todo.pop())
        if text is None:
            continue
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            return False  # the job cannot be read: let the import say why
        for name in _imported_names(tree):
            base = prefix + name.replace(".", "/")
            hits = {c for c in nearby if c == base + ".py" or c.startswith(base + "/")
                    or c.startswith(base + ".")}
            if hits:
                return False
            for cand in (base + ".py", base + "/__init__.py"):
                if cand not in seen and (root / cand).is_file():
                    seen.add(cand)
                    todo.append(cand)
    return True


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _imported_names(tree: ast.AST) -> set[str]:
    """Every module name a file imports, anywhere in it, with its parent packages:
    ``import a.b`` names ``a`` and ``a.b``; ``from a import b`` names ``a`` and ``a.b``
    (``b`` may be a submodule)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        mods: list[str] = []
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            mods = [base] if base else []
            mods += [f"{base}.{a.name}" if base else a.name for a in node.names]
        for m in mods:
            parts = m.split(".")
            out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return out


def exit_code(entries: list[Entry], allow_migration: bool = False) -> int:
    """The worst outcome's exit code; with ``--allow-migration`` a migrate passes."""
    def outcome(e: Entry) -> str:
        return "in_place" if allow_migration and e.outcome == "migrate" else e.outcome

    if not entries:
        return 0
    return OUTCOMES[outcome(max(entries, key=lambda e: OUTCOMES[outcome(e)][0]))][1]


#: the outcomes in the order the summary counts them, with the words it uses
SUMMARY = (("identical", "identical"), ("in_place", "in place"), ("migrate", "migrate"),
           ("unsupported", "unsupported"), ("new", "new"), ("removed", "removed"),
           ("invalid", "invalid"))
_ICON = {"identical": "✅", "in_place": "✅", "new": "🆕", "removed": "🗑️", "migrate": "⚠️",
         "unsupported": "⛔", "invalid": "❌"}


#: what a plan without a report means
NOTE = {"new": "a new plan, nothing to compare it with (theseus run deploys it)",
        "removed": "the plan is gone: its running query must be stopped by hand"}


def counts(entries: list[Entry]) -> dict[str, int]:
    return {k: sum(1 for e in entries if e.outcome == k) for k, _ in SUMMARY}


def summary(entries: list[Entry], ref: str) -> str:
    """One line for all plans: ``N plans against REF: k identical, k in place, ...``."""
    n = counts(entries)
    return (f"{len(entries)} plan{'' if len(entries) == 1 else 's'} against {ref}: " +
            ", ".join(f"{n[k]} {word}" for k, word in SUMMARY))


def changed(entries: list[Entry]) -> list[Entry]:
    """The entries worth a reader's time: every plan but the identical ones."""
    return [e for e in entries if e.outcome != "identical"]


def render(entries: list[Entry], ref: str, fmt: str, allow_migration: bool = False) -> str:
    """All plans' outcomes: a one-line summary first, then only the plans that changed (JSON
    lists every plan for tools; SARIF has results for findings only)."""
    from compat import report as R

    if fmt == "json":
        doc: dict[str, Any] = {"format": "theseus.multireport/1", "against": ref,
                               "exit_code": exit_code(entries, allow_migration),
                               "summary": counts(entries),
                               "files": []}
        for e in entries:
            item: dict[str, Any] = {"path": e.path, "outcome": e.outcome}
            if e.report:
                item["report"] = e.report.to_json()
            if e.error:
                item["error"] = e.error
            doc["files"].append(item)
        return json.dumps(doc, indent=2) + "\n"
    if fmt == "sarif":
        runs = [json.loads(R.render_sarif(e.report))["runs"][0] for e in entries if e.report]
        runs += [_sarif_of_file(e) for e in entries if not e.report and e.error]
        base = json.loads(R.render_sarif_empty())
        if runs:
            base["runs"][0]["results"] = [r for run in runs for r in run["results"]]
            rules = {r["id"]: r for run in runs for r in run["tool"]["driver"]["rules"]}
            base["runs"][0]["tool"]["driver"]["rules"] = list(rules.values())
            ids = [r["id"] for r in base["runs"][0]["tool"]["driver"]["rules"]]
            for res in base["runs"][0]["results"]:
                res["ruleIndex"] = ids.index(res["ruleId"])
        return json.dumps(base, indent=2) + "\n"
    if fmt == "markdown":
        return _markdown(entries, ref)
    line = summary(entries, ref)
    if fmt == "github":
        out = [f"::notice title=theseus::{line}"]
        for e in changed(entries):
            if e.report:
                out.append(f"::notice file={e.path},title=theseus {e.outcome}::{e.path}: "
                           f"{e.outcome} — {R.VERDICT_TEXT[e.outcome]}")
                out.append(R.render_github(e.report, verdict=False).rstrip("\n"))
            else:
                level = "error" if e.error else "notice"
                msg = (e.error or NOTE[e.outcome]).replace("%", "%25") \
                    .replace("\r", "%0D").replace("\n", "%0A")
                at = f"file={e.path}" + (f",line={e.line}" if e.line else "") \
                    + (f",col={e.col}" if e.line and e.col else "")
                out.append(f"::{level} {at}::{msg}")
        return "\n".join(x for x in out if x) + "\n"
    out = [line]
    for e in changed(entries):
        out.append("")
        out.append(f"== {e.path} ({e.outcome})" + (f": {NOTE[e.outcome]}"
                                                    if e.outcome in NOTE else ""))
        if e.report:
            out.append(R.render(e.report, "text").rstrip("\n"))
        elif e.error:
            out.append(("✗ " if e.outcome == "removed" else "") + e.error)
    return "\n".join(out) + "\n"


#: the SARIF rule of a file that has no report: removed (exit 1) or invalid (exit 2)
FILE_RULES = {
    "removed": ("plan-removed", "a plan was removed: its running query must be stopped by "
                "hand (theseus stop)"),
    "invalid": ("plan-invalid", "a plan cannot be read or is invalid: nothing can be said "
                "about its upgrade"),
}


def _sarif_of_file(e: Entry) -> dict[str, Any]:
    """A SARIF run of one result for a file without a report (removed or invalid), so that
    a gate failing on it says why where SARIF is read."""
    rule, text = FILE_RULES[e.outcome]
    physical: dict[str, Any] = {"artifactLocation": {"uri": e.path}}
    if e.line:
        physical["region"] = {"startLine": e.line, **({"startColumn": e.col} if e.col else {})}
    return {"tool": {"driver": {"rules": [{
                "id": rule, "name": rule.replace("-", " "),
                "shortDescription": {"text": rule.replace("-", " ")},
                "help": {"text": text}, "properties": {"effect": e.outcome}}]}},
            "results": [{"ruleId": rule, "level": "error", "message": {"text": e.error},
                         "locations": [{"physicalLocation": physical}],
                         "properties": {"outcome": e.outcome}}]}


def _markdown(entries: list[Entry], ref: str) -> str:
    """A pull-request comment: the summary, ONE table of the plans that changed, and each
    plan's findings folded under it."""
    from html import escape

    from compat import report as R

    todo = changed(entries)
    out = [f"## Theseus: plans against `{ref}`", "", summary(entries, ref) + ".", ""]
    if not todo:
        out += ["No plan changed.", ""]
        return "\n".join(out)
    out += ["| plan | outcome | findings |", "|---|---|---|"]
    for e in todo:
        n = len(e.report.findings) if e.report else "—"
        note = f": {NOTE[e.outcome]}" if e.outcome in NOTE else ""
        out.append(f"| `{R._md(e.path)}` | {_ICON[e.outcome]} {e.outcome}{note} | {n} |")
    out.append("")
    for e in todo:
        if not (e.report and e.report.findings) and not e.error:
            continue
        what = (f"{len(e.report.findings)} finding{'' if len(e.report.findings) == 1 else 's'}"
                if e.report else "error")
        out += [f"<details><summary><code>{escape(e.path)}</code>: {e.outcome}, {what}"
                "</summary>", ""]
        if e.report:
            for f in e.report.findings:
                out.append(f"- {R._SEVERITY_MARK[f.severity]} **{f.effect}** `{f.code}` at "
                           f"{R._md(R.at(e.report, f))}: {R._md(f.message)}. "
                           f"*What to do:* {R._md(f.hint)}")
        else:
            out += ["```", e.error or "", "```"]
        out += ["", "</details>", ""]
    return "\n".join(out)
