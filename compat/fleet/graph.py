"""Loading a fleet and its global graph: queries connected through the topics they write
and read.

A fleet is a directory tree: every ``*.json`` and ``*.sql`` file in it is one query's plan,
and so is every ``*.py`` file that defines the builder function (``build``; read from its
syntax tree, :func:`compat.loaders.defines_builder`): a PySpark job, imported under Spark.
The other ``*.py`` files are the helper modules the jobs import: skipped, and counted
(folders and files whose name starts with ``.`` are skipped too: ``.git``, a ``.theseus``
store).
A JSON file that is not a plan document at all is an error, not skipped: a fleet directory
is the list of what is deployed, and a stray file there is a mistake to point at, not data
to guess about.  Queries are known by their plan's ``query`` name; a topic is written by at
most one query.

The graph is kept apart from the plans (as ``compat.model.Plan`` keeps its edges apart from
the steps): ``producers`` and ``consumers`` by topic.  Order and cycles are computed here
in plain Python, so that reading a fleet does not import networkx; ``Fleet.graph`` builds
the networkx graph for those who draw or query it.
"""

from __future__ import annotations

import copy
import heapq
import json
import os
import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compat.check import is_job, is_sql, load_plan
from compat.errors import CheckError, FleetError, PlanError
from compat.gitcheck import RefTree, git
from compat.loaders import defines_builder
from compat.model import Plan
from compat.steps import Source

#: plan files: JSON documents, Spark SQL scripts (compiled on the fly) and PySpark jobs
#: (imported on the fly)
SUFFIXES = (".json", ".sql", ".py")
#: what a folder of plans holds, for the error on one that holds none
PLAN_FILES = "*.json or *.sql plans, or *.py jobs defining build(spark), in its tree"


@dataclass
class FleetQuery:
    """One query of the fleet: its plan and where it reads and writes."""

    name: str  # plan.query
    path: str  # path relative to the fleet root, posix
    plan: Plan
    sources: dict[str, str]  # source node id -> topic, in plan order
    sink_topic: str

    def where(self, pointer: str) -> str:
        """Where a part of the plan was written, for messages: ``file at /pointer``, or
        ``file:line:col`` for a SQL script (its pointers are into JSON nobody wrote)."""
        pos = self.plan.position(pointer)
        if pos is not None:
            return f"{self.plan.source(pos)}:{pos.line}:{pos.col}"
        return f"{self.plan.file} at {pointer}"


@dataclass
class Fleet:
    """The queries of a fleet by name, and the topics between them."""

    root: str
    queries: dict[str, FleetQuery] = field(default_factory=dict)
    #: topic -> the query that writes it
    producers: dict[str, str] = field(default_factory=dict)
    #: topic -> [(query, source node id)] reading it, sorted
    consumers: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    #: each plan file's bytes by its path relative to the root (``fleet check --against``
    #: compares them before reading the other side)
    files: dict[str, bytes] = field(default_factory=dict, repr=False)
    #: the ``*.py`` files that define no builder: modules the jobs import (relative, posix)
    helpers: list[str] = field(default_factory=list)

    def successors(self, query: str) -> list[str]:
        """The queries that read what ``query`` writes, by name."""
        topic = self.queries[query].sink_topic
        return sorted({q for q, _ in self.consumers.get(topic, [])})

    def order(self) -> list[str]:
        """Every query, upstream first.  Queries on a cycle have no upstream among them:
        they are kept together, in name order, where the cycle as a whole falls; between
        independent queries the smaller name (the smallest of a cycle's) comes first, so
        the same fleet always gives the same order."""
        comps = self._components()
        comp_of = {q: i for i, c in enumerate(comps) for q in c}
        preds: dict[int, set[int]] = {i: set() for i in range(len(comps))}
        succs: dict[int, set[int]] = {i: set() for i in range(len(comps))}
        for q in self.queries:
            for s in self.successors(q):
                a, b = comp_of[q], comp_of[s]
                if a != b:
                    succs[a].add(b)
                    preds[b].add(a)
        waiting = {i: len(p) for i, p in preds.items()}
        ready = [(comps[i][0], i) for i, n in waiting.items() if n == 0]
        heapq.heapify(ready)
        out: list[str] = []
        while ready:
            _, i = heapq.heappop(ready)
            out.extend(comps[i])
            for j in succs[i]:
                waiting[j] -= 1
                if waiting[j] == 0:
                    heapq.heappush(ready, (comps[j][0], j))
        return out

    def cycles(self) -> list[list[str]]:
        """Every elementary cycle of queries through topics (a query reading its own output
        is a cycle of one), each starting at its smallest name, sorted.  A cycle is not an
        error: a feedback loop through Kafka is a legitimate, if delicate, design."""
        out: list[list[str]] = []
        for comp in self._components():
            members = set(comp)
            if len(comp) == 1 and comp[0] not in self.successors(comp[0]):
                continue
            for start in comp:  # cycles through ``start`` and larger names only
                allowed = {q for q in members if q > start}
                path, on_path = [start], {start}
                stack = [iter(self.successors(start))]
                while stack:
                    for nxt in stack[-1]:
                        if nxt == start:
                            out.append(list(path))
                        elif nxt in allowed and nxt not in on_path:
                            path.append(nxt)
                            on_path.add(nxt)
                            stack.append(iter(self.successors(nxt)))
                            break
                    else:
                        stack.pop()
                        on_path.discard(path.pop())
        return sorted(out)

    def external_inputs(self) -> list[str]:
        """Topics read by some query and written by none: the fleet's inputs."""
        return sorted(t for t in self.consumers if t not in self.producers)

    def external_outputs(self) -> list[str]:
        """Topics written by some query and read by none: the fleet's outputs."""
        return sorted(t for t in self.producers if t not in self.consumers)

    def downstream(self, query: str) -> list[str]:
        """Every query that reads, directly or through other queries, what ``query``
        writes (itself excluded, even on a cycle), in ``order()``."""
        seen: set[str] = set()
        todo = [query]
        while todo:
            for s in self.successors(todo.pop()):
                if s not in seen:
                    seen.add(s)
                    todo.append(s)
        seen.discard(query)
        return [q for q in self.order() if q in seen]

    def graph(self) -> Any:
        """The global plan as a ``networkx.DiGraph``: one node per query (attributes
        ``path``, ``sink_topic``), one edge producer -> consumer per topic that connects
        them (attributes ``topic`` and ``sources``, the consumer's source node ids reading
        it).  A query writes one topic, so two queries share at most one edge each way.
        External topics are not nodes: ``external_inputs`` and ``external_outputs``."""
        import networkx as nx  # off the check's import path: only the fleet commands draw

        g = nx.DiGraph()
        for name in self.order():
            q = self.queries[name]
            g.add_node(name, path=q.path, sink_topic=q.sink_topic)
        for topic, readers in sorted(self.consumers.items()):
            producer = self.producers.get(topic)
            if producer is None:
                continue
            for consumer, source_id in readers:
                if g.has_edge(producer, consumer):
                    g.edges[producer, consumer]["sources"].append(source_id)
                else:
                    g.add_edge(producer, consumer, topic=topic, sources=[source_id])
        return g

    def _components(self) -> list[list[str]]:
        """The strongly connected components of the query graph (Tarjan's algorithm, on a
        stack: a chain of thousands of queries is deeper than Python's recursion), each
        sorted by name."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        on_stack: set[str] = set()
        stack: list[str] = []
        comps: list[list[str]] = []
        for root in sorted(self.queries):
            if root in index:
                continue
            work = [(root, iter(self.successors(root)))]
            index[root] = low[root] = len(index)
            stack.append(root)
            on_stack.add(root)
            while work:
                node, it = work[-1]
                for nxt in it:
                    if nxt not in index:
                        index[nxt] = low[nxt] = len(index)
                        stack.append(nxt)
                        on_stack.add(nxt)
                        work.append((nxt, iter(self.successors(nxt))))
                        break
                    if nxt in on_stack:
                        low[node] = min(low[node], index[nxt])
                else:
                    work.pop()
                    if work:
                        parent = work[-1][0]
                        low[parent] = min(low[parent], low[node])
                    if low[node] == index[node]:
                        comp = []
                        while True:
                            member = stack.pop()
                            on_stack.discard(member)
                            comp.append(member)
                            if member == node:
                                break
                        comps.append(sorted(comp))
        return comps


def load_fleet(root: str, *, allow_empty: bool = False) -> Fleet:
    """The fleet under the directory ``root``: every ``*.json``, ``*.sql`` and job ``*.py``
    file in its tree, hidden folders and files skipped.  A folder that holds no plan is an error (a
    typo in the path would otherwise pass as an empty fleet), unless ``allow_empty`` (a
    side of ``fleet check``, which refuses only two empty sides)."""
    top = Path(root)
    if not top.is_dir():
        raise FleetError("not a directory", file=root, expected="a folder of plans",
                         found="no such folder" if not top.exists() else "a file")
    files: dict[str, bytes] = {}
    for folder, dirs, names in os.walk(top):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            if name.startswith(".") or not name.lower().endswith(SUFFIXES):
                continue
            path = Path(folder) / name
            try:
                files[path.relative_to(top).as_posix()] = path.read_bytes()
            except OSError as e:
                raise FleetError(f"cannot read file: {e.strerror}", file=str(path)) from None
    fleet = load_fleet_files(root, files, lambda rel: str(top / rel))
    if not fleet.queries and not allow_empty:
        raise empty_fleet(root, fleet)
    return fleet


def _listed(top: Path) -> dict[str, Path]:
    """The files under ``top`` a fleet reads (plans and helper modules), by their path
    relative to it (posix), as :func:`load_fleet` walks them."""
    out: dict[str, Path] = {}
    for folder, dirs, names in os.walk(top):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            if not name.startswith(".") and name.lower().endswith(SUFFIXES):
                path = Path(folder) / name
                out[path.relative_to(top).as_posix()] = path
    return out


def unchanged_at(ref: str, root: str) -> tuple[str, list[str]] | None:
    """The fleet's name at the ref (``REF:path``, as :func:`load_fleet_at` names it) and
    its plan files under ``root`` (relative, posix, in path order) when nothing a fleet
    reads there differs between the work tree and the git ref ``ref``: the same files, each
    with the same bytes, and no local module a job imports changed (the test ``check
    --against`` makes before it imports a job).  None when something differs, or when
    ``root`` or ``ref`` is not what ``--against`` needs (the full load says why).  Nothing
    is imported or parsed but the jobs' import statements: the answer costs a few git
    commands, whatever the fleet's size."""
    top = Path(root)
    if not top.is_dir():
        return None
    found = git(["rev-parse", "--show-toplevel"], top)
    if found.returncode != 0:
        return None
    repo = Path(found.stdout.decode().strip())
    if git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], repo).returncode:
        return None
    try:
        rel_root = top.resolve().relative_to(repo.resolve()).as_posix()
    except ValueError:
        return None
    prefix = "" if rel_root == "." else rel_root + "/"
    here = _listed(top)
    listing = git(["ls-tree", "-r", "-z", "--name-only", ref, "--", rel_root], repo)
    there = {n[len(prefix):] for n in listing.stdout.decode(errors="surrogateescape")
             .split("\0") if n.startswith(prefix) and n.lower().endswith(SUFFIXES)}
    there = {n for n in there if not any(p.startswith(".") for p in n.split("/"))}
    if not here or set(here) != there:
        return None
    from compat.gitcheck import changed_files, job_deps_unchanged

    try:
        changed = changed_files(ref, repo)
    except CheckError:
        return None
    if any(prefix + rel in changed for rel in here):
        return None
    plans = []
    for rel, path in here.items():
        if is_job(rel):
            if not defines_builder(path.read_bytes()):
                continue  # a helper module: unchanged, and no query
            if not job_deps_unchanged(prefix + rel, repo, changed):
                return None
        plans.append(rel)
    return f"{ref}:{rel_root}", sorted(plans)


def empty_fleet(root: str, fleet: Fleet, where: str = "") -> FleetError:
    """The error on a folder that holds no plan (a typo in the path must not pass as an
    empty fleet), counting the helper modules it holds instead."""
    n = len(fleet.helpers)
    return FleetError(f"the folder holds no plan{where}", file=root, expected=PLAN_FILES,
                      found="none" + (f" ({n} helper module{'s' * (n != 1)} skipped: .py "
                                      "files that define no build function)" if n else ""))


def load_fleet_files(root: str, files: dict[str, bytes],
                     job_file: Callable[[str], str] | None = None, same: Fleet | None = None,
                     unchanged: Callable[[str], bool] | None = None) -> Fleet:
    """The fleet made of ``files`` (path relative to ``root``, posix -> content); messages
    name each file as ``root/path``.  Files are read in path order, so that of two queries
    writing one topic (or named alike) the error is always on the same one.  A job is
    imported from a file on disk, since it imports its sibling modules: ``job_file`` gives
    the path of one (``rel`` -> path); without it, job files are refused.  A file whose
    bytes equal those of the same path in the fleet ``same`` (the other side of a check)
    is not read again: its plan is that fleet's, named by this fleet's path; ``unchanged``
    may still refuse the reuse (a job whose local modules changed)."""
    fleet = Fleet(root)
    by_path = {q.path: q for q in same.queries.values()} if same is not None else {}
    for rel in sorted(files):
        if not rel.lower().endswith(SUFFIXES) or \
                any(part.startswith(".") for part in rel.split("/")):
            continue
        name = posixpath.join(root, rel)
        if is_job(rel) and not defines_builder(files[rel]):
            fleet.helpers.append(rel)
            continue
        fleet.files[rel] = files[rel]
        twin = by_path.get(rel)
        if twin is not None and same is not None and same.files.get(rel) == files[rel] \
                and (unchanged is None or unchanged(rel)):
            plan = copy.copy(twin.plan)
            plan.file = name
            q = FleetQuery(twin.name, rel, plan, twin.sources, twin.sink_topic)
        elif is_job(rel):
            q = _load_query(name, rel, None, job_file(rel) if job_file else name)
        else:
            q = _load_query(name, rel, files[rel])
        _add(fleet, q)
    for readers in fleet.consumers.values():
        readers.sort()
    return fleet


def load_fleet_at(ref: str, root: str, same: Fleet | None = None) -> Fleet:
    """The fleet under ``root`` as it was at the git ref ``ref`` (files are named
    ``REF:path``, as ``check --against`` names them).  A folder that did not exist at the
    ref is an empty fleet: every query in it is new.  ``same`` is the work tree's fleet
    under ``root``: a file with the same bytes there is not read again."""
    top = git(["rev-parse", "--show-toplevel"], Path.cwd())
    if top.returncode != 0:
        raise CheckError("not inside a git repository", found=str(Path.cwd()),
                         expected="a git work tree (for --against)")
    repo = Path(top.stdout.decode().strip())
    if git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], repo).returncode:
        raise CheckError(f"git ref '{ref}' not found", expected="a branch, tag or commit",
                         found=repr(ref))
    try:
        rel_root = Path(root).resolve().relative_to(repo.resolve()).as_posix()
    except ValueError:
        raise CheckError("path is outside the git repository", file=root,
                         expected=f"a path inside {repo}", found=str(Path(root).resolve())
                         ) from None
    listing = git(["ls-tree", "-r", "-z", "--name-only", ref, "--", rel_root], repo)
    prefix = "" if rel_root == "." else rel_root + "/"
    files: dict[str, bytes] = {}
    for name in listing.stdout.decode(errors="surrogateescape").split("\0"):
        if not name.startswith(prefix) or not name.lower().endswith(SUFFIXES):
            continue
        blob = git(["show", f"{ref}:{name}"], repo)
        if blob.returncode == 0:
            files[name[len(prefix):]] = blob.stdout
    # a job imports its sibling modules as they were at the ref: from a checkout of it,
    # made only when a job must be imported (one whose bytes and local modules are those of
    # the work tree reuses the work tree's plan)
    with RefTree(ref, repo) as tree:
        unchanged = None
        if any(is_job(n) for n in files):
            from compat.gitcheck import job_deps_unchanged

            unchanged = (lambda rel: not is_job(rel) or
                         job_deps_unchanged(prefix + rel, repo, tree.changed()))
        return load_fleet_files(f"{ref}:{rel_root}", files,
                                lambda rel: tree.file(prefix + rel), same, unchanged)


def _load_query(file: str, rel: str, raw: bytes | None,
                job_path: str | None = None) -> FleetQuery:
    """One query: a plan read from ``raw`` and named ``file``, or a job imported from
    ``job_path`` (a checkout of a ref: the plan is still named ``file``)."""
    if job_path is not None:
        plan = load_plan(job_path)
        plan.file = file
    else:
        try:
            plan = load_plan(file, raw=raw)
        except PlanError:
            if not is_sql(file):
                _refuse_non_plan(file, raw or b"")
            raise
    sources = {nid: n.topic for nid, n in plan.nodes.items() if isinstance(n, Source)}
    return FleetQuery(plan.query, rel, plan, sources, plan.sink.topic)  # type: ignore[attr-defined]


def _refuse_non_plan(file: str, raw: bytes) -> None:
    """A JSON document that does not even try to be a plan (no ``query``, no ``nodes``,
    no plan ``format``) is named as such, rather than as a plan missing its ``format``."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return  # malformed JSON: the plan reader's message says where
    if isinstance(doc, dict) and ("query" in doc or "nodes" in doc or
                                  str(doc.get("format", "")).startswith("theseus.plan/")):
        return
    if isinstance(doc, dict):
        found = ("an object with format " + repr(doc["format"]) if "format" in doc else
                 "an object with keys " + ", ".join(map(repr, list(doc)[:5])) if doc else
                 "an empty object")
    else:
        found = "a JSON " + _JSON_TYPE.get(type(doc), "value")
    raise FleetError("not a plan: every JSON file in a fleet is one query's plan", file=file,
                     pointer="", expected="a theseus.plan/1 document with 'query' and "
                     "'nodes'", found=found, hint="Move other files out of the fleet's "
                     "folder (folders whose name starts with '.' are skipped)")


_JSON_TYPE = {list: "array", str: "string", int: "number", float: "number", bool: "boolean",
              type(None): "null"}


def _add(fleet: Fleet, q: FleetQuery) -> None:
    """Add a query to the fleet, refusing a second query of one name or one output."""
    other = fleet.queries.get(q.name)
    if other is not None:
        raise FleetError(f"two plans define the query '{q.name}'", **_at(q, "/query"),
                         expected="one plan per query name",
                         found=f"also the query of {other.where('/query')}",
                         hint="Rename one of them (its `query`)")
    producer = fleet.producers.get(q.sink_topic)
    if producer is not None:
        p = fleet.queries[producer]
        raise FleetError(f"two queries write the topic '{q.sink_topic}'",
                         node=q.plan.sink_id,
                         **_at(q, q.plan.pointer(q.plan.sink_id, "topic")),
                         expected="one producing query per topic",
                         found=f"query '{q.name}' here and query '{producer}' at "
                         f"{p.where(p.plan.pointer(p.plan.sink_id, 'topic'))}",
                         hint="Interleaved writers break the topic's keys and changelog "
                         "for every reader: give one of them its own topic")
    fleet.queries[q.name] = q
    fleet.producers[q.sink_topic] = q.name
    for nid, topic in q.sources.items():
        fleet.consumers.setdefault(topic, []).append((q.name, nid))


def _at(q: FleetQuery, pointer: str) -> dict[str, Any]:
    """An error's location in ``q``'s file: the JSON pointer, or for a SQL script the line
    and column where that part was written."""
    pos = q.plan.position(pointer)
    if pos is not None:
        return {"file": f"{q.plan.source(pos)}:{pos.line}:{pos.col}"}
    return {"file": q.plan.file, "pointer": pointer}
