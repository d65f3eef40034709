"""``theseus check --against REF PATH...``: every plan under PATH against its version at a
git ref, as a pull-request job runs it.  One report for all files; the exit code is the
worst outcome (an invalid plan counts as worst: nothing can be said about it)."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compat.check import Report, check_plans, load_plan
from compat.errors import CheckError, TheseusError

#: outcome -> (rank, exit code)
OUTCOMES = {"identical": (0, 0), "in_place": (1, 0), "new": (1, 0), "removed": (2, 1),
            "migrate": (3, 1), "unsupported": (4, 3), "invalid": (5, 2)}


@dataclass
class Entry:
    path: str
    outcome: str
    report: Report | None = None
    error: str | None = None


def _git(args: list[str], cwd: Path) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, check=False)
    except FileNotFoundError:
        raise CheckError("git is not installed", expected="git on PATH",
                         found="no git") from None


def _is_plan_text(raw: bytes) -> bool:
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
            out.extend(sorted(path.rglob("*.json")))
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
                  schema_compat: str = "forward") -> list[Entry]:
    cwd = Path.cwd()
    top = _git(["rev-parse", "--show-toplevel"], cwd)
    if top.returncode != 0:
        raise CheckError("not inside a git repository", found=str(cwd),
                         expected="a git work tree (for --against)")
    root = Path(top.stdout.decode().strip())
    if _git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], cwd).returncode != 0:
        raise CheckError(f"git ref '{ref}' not found", expected="a branch, tag or commit",
                         found=repr(ref))
    for p in paths:
        _inside(Path(p), root)
    entries: list[Entry] = []
    current = collect(paths)
    seen: set[str] = set()
    for path in current:
        try:
            raw_new = path.read_bytes()
        except OSError as e:
            entries.append(Entry(str(path), "invalid",
                                 error=f"{path}: cannot read file: {e.strerror}"))
            continue
        if not _is_plan_text(raw_new):
            continue
        rel = path.resolve().relative_to(root).as_posix()
        seen.add(rel)
        old = _git(["show", f"{ref}:{rel}"], root)
        try:
            if old.returncode != 0:
                load_plan(str(path))
                entries.append(Entry(str(path), "new"))
                continue
            if not _is_plan_text(old.stdout):
                entries.append(Entry(str(path), "new"))
                continue
            old_plan = load_plan(f"{ref}:{rel}", raw=old.stdout)
            new_plan = load_plan(str(path), reuse=old_plan)
            report = check_plans(old_plan, new_plan, require=require,
                                 schema_compat=schema_compat)
            entries.append(Entry(str(path), report.verdict, report))
        except TheseusError as e:
            entries.append(Entry(str(path), "invalid", error=e.render()))
    # Plans that existed at REF under the same paths and are gone now.
    for p in paths:
        rel_dir = Path(p).resolve()
        try:
            rel = rel_dir.relative_to(root).as_posix()
        except ValueError:
            continue
        listing = _git(["ls-tree", "-r", "--name-only", ref, "--", rel], root)
        for name in listing.stdout.decode().splitlines():
            if name.endswith(".json") and name not in seen and not (root / name).exists():
                blob = _git(["show", f"{ref}:{name}"], root).stdout
                if _is_plan_text(blob):
                    seen.add(name)
                    entries.append(Entry(name, "removed"))
    return entries


def exit_code(entries: list[Entry]) -> int:
    if not entries:
        return 0
    worst = max(entries, key=lambda e: OUTCOMES[e.outcome][0])
    return OUTCOMES[worst.outcome][1]


def render(entries: list[Entry], ref: str, fmt: str) -> str:
    from compat import report as R

    if fmt == "json":
        doc: dict[str, Any] = {"format": "theseus.multireport/1", "against": ref,
                               "exit_code": exit_code(entries), "files": []}
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
        base = json.loads(R.render_sarif_empty())
        if runs:
            base["runs"][0]["results"] = [r for run in runs for r in run["results"]]
            rules = {r["id"]: r for run in runs for r in run["tool"]["driver"]["rules"]}
            base["runs"][0]["tool"]["driver"]["rules"] = list(rules.values())
            ids = [r["id"] for r in base["runs"][0]["tool"]["driver"]["rules"]]
            for res in base["runs"][0]["results"]:
                res["ruleIndex"] = ids.index(res["ruleId"])
        return json.dumps(base, indent=2) + "\n"
    out = []
    if fmt == "markdown":
        out.append(f"## Theseus: plans against `{ref}`\n")
        out.append("| plan | outcome |\n|---|---|")
        out.extend(f"| `{e.path}` | {e.outcome} |" for e in entries)
        out.append("")
    for e in entries:
        if e.report:
            text = R.render(e.report, fmt)
        elif fmt == "github":
            level = "error" if e.outcome == "invalid" else "notice"
            text = f"::{level} file={e.path}::{e.error or 'plan ' + e.outcome}\n"
        else:
            text = f"{e.path}: {e.outcome}{' — ' + e.error if e.error else ''}\n"
        if fmt == "text":
            out.append(f"== {e.path} ({e.outcome})")
        out.append(text)
    if fmt == "text":
        out.append(f"{len(entries)} plan(s) against {ref}: " + ", ".join(
            f"{k} {sum(1 for e in entries if e.outcome == k)}"
            for k in OUTCOMES if any(e.outcome == k for e in entries)))
    return "\n".join(out) + "\n"
