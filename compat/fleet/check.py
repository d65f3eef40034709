"""``theseus fleet check OLD_DIR NEW_DIR``: a change to a fleet of queries, checked query by
query and carried across every topic edge to the queries downstream.

Steps, in this fixed order:

1. every query of either fleet gets a status: ``new``, ``removed``, ``changed`` or
   ``unchanged`` (queries are matched by their ``query`` name); a query in both is checked
   with the single-query checker.  A producer whose output topic is read by queries of the
   fleet has its own output rules (schema and changelog mode, ``compat.rules.output``)
   replaced by step 2; a topic nobody in the fleet reads is an external output and keeps
   ``--schema-compat``;
2. every topic edge where the producer or the consumer is not unchanged is checked with
   ``compat.fleet.contract.impacts``: findings ``upstream-*`` on the consumer;
3. queries are visited upstream first (``Fleet.order``): a query rebuilt by a live
   migration (its verdict is ``migrate``) rewrites the history of its output, so every
   stateful query reading it (every one under ``--require backfill``) must be migrated with
   it (``upstream-migrated``), and so on downstream, around cycles too;
4. a query's verdict is the worst of its own findings and its impacts; ``caused_by`` names
   the upstream queries whose change reached it, transitively; the fleet's verdict is the
   worst query's; the migrations are ordered in waves, upstream first (the queries of a
   cycle migrate in one wave).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Any

from compat.check import VERDICT_EXIT, Report, check_plans, dedupe, verdict_of
from compat.findings import Finding, finding, register_codes, settle
from compat.fleet.contract import Contract, impacts, produced
from compat.fleet.graph import Fleet
from compat.model import Plan

#: findings on an edge that say how it is, not what a change did to it: they do not make
#: the producer a cause
STEADY_STATE = frozenset({"upstream-mode-mismatch", "upstream-column-missing",
                          "upstream-schema-mismatch"})
VERDICTS = ("identical", "in_place", "migrate", "unsupported")
STATUSES = ("changed", "unchanged", "new", "removed")

register_codes({
    "upstream-migrated": (
        "migrate", "error", "topology",
        "Migrate this query with its producer (theseus migrate start, in the wave the report "
        "gives): its shadow rebuilds its state from the producer's new history."),
    "query-added": (
        "in_place", "info", "topology",
        "Deploy it with theseus run once the topics it reads are written."),
    "query-removed": (
        "migrate", "warning", "topology",
        "Stop the running query by hand (theseus stop) once nothing reads its output."),
})


@dataclass
class QueryResult:
    """One query of the fleet check: its status, verdict and findings (its own and those
    its upstream queries cause), the upstream queries whose change reached it, and its
    place in the fleet's order (upstream first)."""

    query: str
    status: str
    verdict: str
    findings: list[Finding]
    caused_by: list[str]
    order: int
    path: str
    #: the plan as checked (the new one; the old one for a removed query); None for a
    #: query not read at all (``fleet check --against`` with every file unchanged)
    plan: Plan | None
    old_plan: Plan | None = None
    #: the single-query check, for a query in both fleets
    report: Report | None = None
    wave: int | None = None
    #: the plan's file as read (the plan's own, when there is one)
    file: str = ""

    def __post_init__(self) -> None:
        if self.plan is not None:
            self.file = self.plan.file

    def as_report(self, fleet: FleetReport) -> Report:
        """The query's findings as a single-query report, for the renderers of
        ``compat.report``."""
        base = self.report
        assert self.plan is not None  # a query with findings was read
        return Report(self.verdict, self.findings, self.old_plan or self.plan, self.plan,
                      base.alignment if base else [], fleet.require, fleet.schema_compat,
                      base.requirements if base else [],
                      allow_migration=fleet.allow_migration)

    def to_json(self) -> dict[str, Any]:
        rep = self.report
        return {
            "query": self.query, "status": self.status, "verdict": self.verdict,
            "path": self.path, "file": self.file,
            "findings": [_finding_json(self, f) for f in self.findings],
            "caused_by": self.caused_by, "order": self.order, "wave": self.wave,
            "upgrade_types": sorted({f.upgrade_type for f in self.findings
                                     if f.effect != "none"}),
            "requirements": rep.requirements if rep else [],
        }


def _finding_json(q: QueryResult, f: Finding) -> dict[str, Any]:
    doc = f.to_json()
    for side, plan in (("old", q.old_plan), ("new", q.plan)):
        loc = doc[side]
        if plan is not None and plan.positions and (loc["node"] or loc["pointer"]):
            pos = plan.position(loc["pointer"], loc["node"])
            if pos is not None:
                if pos.file:
                    loc["file"] = pos.file
                loc["line"], loc["column"] = pos.line, pos.col
    return doc


@dataclass
class FleetReport:
    verdict: str
    queries: list[QueryResult]
    waves: list[list[str]]
    cycles: list[list[str]]
    old_root: str
    new_root: str
    require: list[str] = field(default_factory=list)
    schema_compat: str = "forward"
    allow_migration: bool = False
    #: every file was unchanged at the ref: no plan was read (queries named by path, no
    #: cycles looked for)
    unread: bool = False

    @property
    def exit_code(self) -> int:
        if self.allow_migration and self.verdict == "migrate":
            return 0
        return VERDICT_EXIT[self.verdict]

    def by_name(self) -> dict[str, QueryResult]:
        return {q.query: q for q in self.queries}

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "theseus.fleet-report/1",
            "verdict": self.verdict, "exit_code": self.exit_code,
            "old": self.old_root, "new": self.new_root,
            "require": self.require, "schema_compat": self.schema_compat,
            "allow_migration": self.allow_migration,
            "summary": {s: sum(1 for q in self.queries if q.status == s) for s in STATUSES},
            "queries": [q.to_json() for q in self.queries],
            "waves": self.waves, "cycles": self.cycles,
        }


def check_fleets(old: Fleet, new: Fleet, *, require: list[str] | None = None,
                 schema_compat: str = "forward",
                 allow_migration: bool = False) -> FleetReport:
    """The fleet check of ``new`` against ``old`` (see the module's steps)."""
    require = sorted(set(require or []))
    order = new.order()
    removed = [q for q in old.order() if q not in new.queries]
    # Step 1: each query on its own.
    own: dict[str, list[Finding]] = {}
    reports: dict[str, Report] = {}
    status: dict[str, str] = {}
    for name in order:
        q = new.queries[name]
        was = old.queries.get(name)
        if was is None:
            status[name] = "new"
            own[name] = [finding("query-added", f"query '{name}' is new: it reads "
                                 f"{_topics(q.sources.values())} and writes "
                                 f"'{q.sink_topic}'", new=q.plan.sink_id,
                                 new_pointer=q.plan.pointer(q.plan.sink_id, "topic"))]
            continue
        readers = new.consumers.get(q.sink_topic, [])
        rep = check_plans(was.plan, q.plan, require=require, schema_compat=schema_compat,
                          allow_migration=allow_migration, output_rules=not readers)
        reports[name] = rep
        status[name] = "unchanged" if rep.verdict == "identical" else "changed"
        own[name] = list(rep.findings)
    for name in removed:
        q = old.queries[name]
        status[name] = "removed"
        own[name] = [finding("query-removed", f"query '{name}' is removed: it wrote "
                             f"'{q.sink_topic}'", old=q.plan.sink_id,
                             old_pointer=q.plan.pointer(q.plan.sink_id, "topic"))]
    # Step 2: the contract across every edge a change touches.
    contracts_old = {n: produced(q.plan) for n, q in old.queries.items()}
    contracts_new = {n: produced(q.plan) for n, q in new.queries.items()}
    edge: dict[str, list[tuple[str, Finding]]] = {n: [] for n in order}
    for name in order:
        q = new.queries[name]
        for node, topic in q.sources.items():
            p_old_name = old.producers.get(topic)
            p_new_name = new.producers.get(topic)
            p_old = contracts_old.get(p_old_name) if p_old_name else None
            p_new: Contract | None = contracts_new.get(p_new_name) if p_new_name else None
            if p_new is None and p_old_name in new.queries:
                p_new = contracts_new[p_old_name]  # it writes another topic now
            producer = p_new_name or p_old_name
            if producer is None:
                continue  # an external input
            touched = status[name] != "unchanged" or \
                (p_old_name and status.get(p_old_name) != "unchanged") or \
                (p_new_name and status.get(p_new_name) != "unchanged")
            if not touched:
                continue
            # A consumer new to the fleet has no before: it is checked as it is.
            before = p_old if status[name] != "new" else None
            for f in impacts(before, p_new, q.plan, node):
                # The impact is on the consumer as it will run: its new plan.
                f = Finding(**{**f.__dict__, "old_node": None, "old_pointer": None})
                edge[name].append((producer, f))
    # Step 3: upstream first, impacts and cascading migrations, until nothing changes
    # (a cycle carries a migration, and what caused it, around: the queries upstream on
    # the cycle come later in the order and are read from the previous round).
    rebuilt: set[str] = set()
    caused: dict[str, set[str]] = {}
    findings: dict[str, list[Finding]] = {}
    verdict: dict[str, str] = {}
    for _ in range(len(order) + 2):
        prev = caused
        caused = {}

        for name in order:
            got = list(own[name])
            by: set[str] = set()
            for producer, f in edge[name]:
                got.append(f)
                if status.get(producer, "removed") != "unchanged" and \
                        f.code not in STEADY_STATE:
                    by.add(producer)  # its change reached this query's source
            if status[name] != "new":  # a new query has no state built on old history
                for producer in _producers(new, name):
                    if producer != name and producer in rebuilt:
                        got.append(_cascade(new, producer, name, require))
                        by |= {producer} | caused.get(producer, prev.get(producer, set()))
            by.discard(name)
            findings[name] = got
            caused[name] = by
            verdict[name] = verdict_of(got)
        now = {n for n in order if verdict[n] == "migrate"}
        if now == rebuilt and caused == prev:
            break
        rebuilt = now
    for name in removed:
        findings[name] = list(own[name])
        caused[name] = set()
        verdict[name] = verdict_of(findings[name])
    # Step 4: verdicts, advice under the flags, waves.
    waves = _waves(new, rebuilt, {n for n in order if status[n] == "new"})
    wave_of = {q: i for i, w in enumerate(waves) for q in w}
    results: list[QueryResult] = []
    for i, name in enumerate(order + removed):
        gone = name in removed
        q = (old if gone else new).queries[name]
        was = old.queries.get(name)
        results.append(QueryResult(
            name, status[name], verdict[name],
            [settle(f, allow_migration=allow_migration) for f in dedupe(findings[name])],
            sorted(caused[name]), i, q.path, q.plan,
            was.plan if was is not None and not gone else None, reports.get(name),
            wave_of.get(name)))
    fleet_verdict = VERDICTS[max((VERDICTS.index(r.verdict) for r in results), default=0)]
    return FleetReport(fleet_verdict, results, waves, new.cycles(), old.root, new.root,
                       require, schema_compat, allow_migration)


def _topics(topics: Any) -> str:
    return ", ".join(f"'{t}'" for t in dict.fromkeys(topics)) or "nothing"


def _producers(fleet: Fleet, name: str) -> list[str]:
    """The queries of ``fleet`` that write a topic ``name`` reads."""
    q = fleet.queries[name]
    return sorted({p for t in q.sources.values() if (p := fleet.producers.get(t))})


def _stateful(plan: Plan) -> bool:
    return any(i.stateful for i in plan.info.values())


def _cascade(fleet: Fleet, producer: str, name: str, require: list[str]) -> Finding:
    """The finding on ``name`` for a producer rebuilt by a live migration."""
    q = fleet.queries[name]
    topic = fleet.queries[producer].sink_topic
    node = next((n for n, t in q.sources.items() if t == topic), q.plan.sink_id)
    ptr = q.plan.pointer(node, "topic")
    why = f"query '{producer}' is rebuilt by a live migration: the history of topic " \
        f"'{topic}' is recomputed"
    if _stateful(q.plan) or "backfill" in require:
        reason = "it keeps state built from the old history" if _stateful(q.plan) else \
            "--require backfill: its output must be as if the new upstream had always run"
        when = f"in one wave with '{producer}': they form a cycle" \
            if producer in fleet.downstream(name) else f"after '{producer}'"
        return finding("upstream-migrated", f"{why}, and '{name}' must be migrated with it "
                       f"(a cascading migration, {when}): {reason}", new=node,
                       new_pointer=ptr)
    return finding("upstream-migrated", f"{why}; '{name}' holds no state, so it reads the "
                   "new records from the cut on and needs no migration (what it wrote "
                   "before stays as written)", new=node, new_pointer=ptr, effect="none",
                   severity="info", hint="Nothing to do; with --require backfill it would "
                   "be migrated too.")


def _waves(fleet: Fleet, rebuilt: set[str], new: set[str] = frozenset()) -> list[list[str]]:
    """The queries to migrate, in waves: a query's wave follows the waves of every rebuilt
    query upstream of it; the queries of one cycle share a wave.  A query new to the fleet
    that a migrating query reads (directly or through other new queries) is in the waves
    too, before its readers: it is started with ``theseus run`` and must be writing before
    the shadow of its reader backfills (``fleet optimize``'s shared queries are such)."""
    starts: set[str] = set()
    todo = list(rebuilt)
    while todo:
        for p in _producers(fleet, todo.pop()):
            if p in new and p not in starts:
                starts.add(p)
                todo.append(p)
    rebuilt = rebuilt | starts
    if not rebuilt:
        return []
    import networkx as nx  # the fleet commands only: ``theseus check`` never imports it

    g = nx.DiGraph()
    g.add_nodes_from(sorted(rebuilt))
    for name in sorted(rebuilt):
        for p in _producers(fleet, name):
            if p in rebuilt:
                g.add_edge(p, name)
    cond = nx.condensation(g)
    level: dict[int, int] = {}
    for c in nx.topological_sort(cond):
        level[c] = max((level[p] + 1 for p in cond.predecessors(c)), default=0)
    waves: list[list[str]] = [[] for _ in range(max(level.values()) + 1)]
    for c, lv in level.items():
        waves[lv].extend(cond.nodes[c]["members"])
    rank = {q: i for i, q in enumerate(fleet.order())}
    return [sorted(w, key=rank.__getitem__) for w in waves]




def check_dirs(dirs: list[str], *, against: str | None = None,
               require: list[str] | None = None, schema_compat: str = "forward",
               allow_migration: bool = False) -> FleetReport:
    """``theseus fleet check``: OLD_DIR NEW_DIR, or with ``against`` one DIR against its
    version at that git ref."""
    from compat.errors import CheckError
    from compat.fleet.graph import load_fleet, load_fleet_at, unchanged_at

    want = 1 if against is not None else 2
    if len(dirs) != want:
        raise CheckError("fleet check takes two folders (OLD_DIR NEW_DIR), or --against REF "
                         "and one folder", expected=f"{want} folder(s)", found=str(len(dirs)))
    # Either side may be empty (every query new, or every query removed), not both: a
    # check of nothing would pass silently.
    if against is not None:
        same = unchanged_at(against, dirs[0])
        if same is not None and same[1]:
            # Nothing the fleet reads changed: every query is identical, and a job need not
            # be imported (a Spark start, seconds each) to say so.
            old_root, plans = same
            return FleetReport("identical", [
                QueryResult(rel, "unchanged", "identical", [], [], i, rel, None,
                            file=posixpath.join(dirs[0], rel))
                for i, rel in enumerate(plans)], [], [], old_root, dirs[0], sorted(
                    set(require or [])), schema_compat, allow_migration, unread=True)
        # the work tree first: the ref's files with the same bytes reuse its plans
        new = load_fleet(dirs[0], allow_empty=True)
        old = load_fleet_at(against, dirs[0], same=new)
    else:
        old = load_fleet(dirs[0], allow_empty=True)
        new = load_fleet(dirs[1], allow_empty=True)
    if not old.queries and not new.queries:
        from compat.fleet.graph import empty_fleet

        where = f" or at {against}" if against is not None else f" nor in {dirs[0]}"
        raise empty_fleet(new.root, new, where)
    return check_fleets(old, new, require=require, schema_compat=schema_compat,
                        allow_migration=allow_migration)


__all__ = ["FleetReport", "QueryResult", "check_dirs", "check_fleets"]
