"""``theseus fleet optimize``: compute each shared subplan once (NebulaStream's query merging).

A partial shared subplan (``compat.fleet.signature``) that two or more queries compute is
moved into a query of its own, which writes it to an **internal topic**; each query that
computed it reads that topic instead:

1. The *shared query* is the subplan as the first member (by query name) writes it, with a
   sink: topic ``theseus.shared.<first 12 hex digits of the signature>``, as many partitions
   as the most partitioned source topic the subplan reads (no less parallelism than
   before), ``json`` format, no key, ``append`` mode, ``exactly_once`` delivery (consumers
   must not see a row twice that they used to compute once).  The query is named
   ``shared_<12 hex>`` and its plan file is ``_shared/shared_<12 hex>.json`` in the output
   fleet.  Names derived from the signature make a second run (or a new member joining
   later) find the same topic: a query that already writes it is reused, not duplicated.
2. In each member, the top node of the subplan becomes a ``source`` of the internal topic,
   with the shared query's output columns and types as its schema and, when the subplan's
   output carries a watermark, the same event-time column and watermark.  The source takes
   the node's id, so that downstream steps (and qualified join references) keep working.
   When the member names the columns differently (another alias) a ``project`` with the
   node's id renames them back, and the source is ``<id>_shared`` (another order alone needs
   no project, JSON being read by name, unless the plan has a union, which lines up its
   inputs' columns by position).  The template member is the one whose column names most
   members use.
3. Nodes of the member's old prefix that nothing reads any more are dropped; a node that
   another branch still reads stays.

Only subplans that are safe to move are rewritten: deterministic ones (two ``rand()`` are
not the same rows), over streams, that emit inserts only (an internal topic is read as a
stream of inserts: an aggregate's updates would need a keyed, compacted topic and a table
source; those are reported as skipped).  Complete sharing (two whole queries equal) is left
as it is: each writes its own topic.  The rewrite repeats until nothing is left to share,
so nested shared subplans become a chain of shared queries.

Deploying the result: every rewritten consumer reads another source topic, which ``theseus
check`` says is a live migration (``source-topic-changed``): start the shared queries
first, then migrate each consumer (NebulaStream undeploys and redeploys instead).
"""

from __future__ import annotations

import copy
import graphlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compat import types as T
from compat.errors import FleetError
from compat.fleet.signature import SHORT, Shared, node_signatures, shared_subplans, upstream
from compat.infer import INSERT, analyze, duration_seconds
from compat.model import Plan
from compat.serde import FORMAT, from_doc, node_doc, plan_doc

#: internal topics and the queries that write them are named after the signature
TOPIC_PREFIX = "theseus.shared."
QUERY_PREFIX = "shared_"
#: the folder of the output fleet that holds the shared queries
SHARED_DIR = "_shared"
#: the most rewrites one run makes (each one removes a shared subplan; this is a backstop)
MAX_ROUNDS = 1000


def shared_topic(signature: str) -> str:
    return TOPIC_PREFIX + signature[:SHORT]


def shared_query(signature: str) -> str:
    return QUERY_PREFIX + signature[:SHORT]


@dataclass(frozen=True)
class Rewrite:
    """One shared subplan computed once: the query that writes it (new, or already in the
    fleet), its internal topic and partitions, and the members now reading the topic."""

    shared: Shared
    query: str
    topic: str
    partitions: int
    consumers: tuple[tuple[str, str], ...]
    renamed: tuple[str, ...] = ()  # consumers that rename the shared columns with a project
    new_query: bool = True


@dataclass
class Optimized:
    """The rewritten fleet: every query's plan by name, the documents of the queries that
    are new or changed, what was shared and what was left (with why)."""

    plans: dict[str, Plan]
    docs: dict[str, dict[str, Any]] = field(default_factory=dict)
    rewrites: list[Rewrite] = field(default_factory=list)
    skipped: list[tuple[Shared, str]] = field(default_factory=list)

    @property
    def changed(self) -> set[str]:
        return set(self.docs)

    def start_order(self) -> list[str]:
        """The new shared queries in the order to start them: a shared query reading
        another one's topic after it."""
        new = {rw.query: rw.topic for rw in self.rewrites if rw.new_query}
        writer = {t: q for q, t in new.items()}
        deps = {q: sorted({writer[n.topic] for n in self.plans[q].nodes.values()  # type: ignore[attr-defined]
                           if n.step == "source" and n.topic in writer})  # type: ignore[attr-defined]
                for q in sorted(new)}
        return list(graphlib.TopologicalSorter(deps).static_order())

    def migrate(self) -> list[str]:
        """The queries already deployed that move to an internal topic (live migrations)."""
        new = {rw.query for rw in self.rewrites if rw.new_query}
        return sorted({q for rw in self.rewrites for q, _ in rw.consumers} - new)


def why_not(sh: Shared, plans: dict[str, Plan]) -> str | None:
    """Why a shared subplan is not moved into a query of its own, or None when it is."""
    if sh.kind != "partial":
        return "whole queries are equal (complete sharing): each writes its own topic"
    if not sh.deterministic:
        return "it has a nondeterministic step: its members do not compute the same rows"
    q, n = sh.members[0]
    info = plans[q].info[n]
    if not info.stream:
        return "it reads tables only"
    if info.mode != INSERT:
        return (f"it emits updates [{info.mode}]: an internal topic carries inserts only")
    if any(t == T.UNKNOWN for _, t in info.columns):
        return "the type of one of its columns is not known"
    if not _computes(plans[q], n):
        return "it only reads and renames columns: there is nothing to compute once"
    return None


def _computes(plan: Plan, top: str) -> bool:
    """Whether the subplan under ``top`` does any work beyond reading its sources and
    renaming or reordering their columns (which sharing would only copy to another topic)."""
    sigs = node_signatures(plan)
    for nid in upstream(plan, top):
        node = plan.nodes[nid]
        if node.step in ("source", "stop_gate", "start_gate"):
            continue
        if node.step == "project":
            inside = set(sigs[node.inputs[0]].columns.values())
            if set(sigs[nid].columns.values()) <= inside:
                continue
        return True
    return False


def optimize(plans: dict[str, Plan]) -> Optimized:
    """Rewrite the fleet ``plans`` (query name -> analysed plan) so that every shareable
    partial subplan is computed once; the input plans are not changed."""
    out = Optimized(dict(plans))
    seen_skips: set[str] = set()
    for _ in range(MAX_ROUNDS):
        todo = None
        for sh in shared_subplans(out.plans):
            reason = why_not(sh, out.plans)
            if reason is None:
                todo = sh
                break
            if sh.signature not in seen_skips and sh.kind == "partial":
                seen_skips.add(sh.signature)
                out.skipped.append((sh, reason))
        if todo is None:
            break
        _share(todo, out)
    return out


def _share(sh: Shared, out: Optimized) -> None:
    plans = out.plans
    topic = shared_topic(sh.signature)
    # A query that already writes this topic from this very subplan is reused.
    writer = next(((q, n) for q, n in sh.members
                   if plans[q].sink.topic == topic  # type: ignore[attr-defined]
                   and plans[q].sink.inputs == (n,)), None)
    q0, n0 = writer or _template(sh, plans)
    tmpl = plans[q0]
    nodes = upstream(tmpl, n0)
    partitions = max(tmpl.nodes[n].partitions  # type: ignore[attr-defined]
                     for n in nodes if tmpl.nodes[n].step == "source")
    if writer is None:
        name = shared_query(sh.signature)
        doc = _shared_doc(tmpl, n0, nodes, name, topic, partitions, sh)
        out.plans[name] = _plan(doc, name)
        out.docs[name] = doc
    else:
        name = q0
    consumers = [(q, n) for q, n in sh.members if (q, n) != writer]
    tsig = node_signatures(tmpl)[n0].columns
    renamed = []
    by_query: dict[str, list[str]] = {}
    for q, n in consumers:
        by_query.setdefault(q, []).append(n)
    for q, ns in by_query.items():
        doc, did_rename = _consumer_doc(plans[q], ns, tmpl, n0, tsig, nodes, topic,
                                        partitions)
        out.plans[q] = _plan(doc, q)
        out.docs[q] = doc
        if did_rename:
            renamed.append(q)
    out.rewrites.append(Rewrite(sh, name, topic, partitions, tuple(consumers),
                                tuple(renamed), writer is None))


def _template(sh: Shared, plans: dict[str, Plan]) -> tuple[str, str]:
    """The member whose set of column names most members have (fewest renames), first by
    name."""
    def names(m: tuple[str, str]) -> tuple[str, ...]:
        info = plans[m[0]].info[m[1]]
        return tuple(sorted(info.names or (c for c, _ in info.columns)))
    counts: dict[tuple[str, ...], int] = {}
    for m in sh.members:
        counts[names(m)] = counts.get(names(m), 0) + 1
    return max(sh.members, key=lambda m: (counts[names(m)], [-ord(c) for c in m[0]]))


def _plan(doc: dict[str, Any], name: str) -> Plan:
    plan = from_doc(copy.deepcopy(doc), f"<{name}>")
    analyze(plan)
    return plan


def _unique(base: str, taken: set[str]) -> str:
    nid, k = base, 1
    while nid.lower() in taken:
        k += 1
        nid = f"{base}{k}"
    taken.add(nid.lower())
    return nid


def _shared_doc(tmpl: Plan, n0: str, nodes: set[str], name: str, topic: str,
                partitions: int, sh: Shared) -> dict[str, Any]:
    docs = [node_doc(n) for nid, n in tmpl.nodes.items() if nid in nodes]
    sink_id = _unique("shared_out", {nid.lower() for nid in nodes})
    docs.append({"id": sink_id, "step": "sink", "version": 1, "inputs": [n0], "topic": topic,
                 "format": "json", "key_columns": [], "mode": "append",
                 "delivery": "exactly_once"})
    doc: dict[str, Any] = {"format": FORMAT, "query": name}
    if tmpl.state_partitions is not None:
        doc["config"] = {"state_partitions": tmpl.state_partitions}
    doc["metadata"] = {"shared": {"signature": sh.signature, "topic": topic,
                                  "partitions": partitions,
                                  "members": [f"{q}:{n}" for q, n in sh.members]}}
    doc["nodes"] = docs
    return doc


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _consumer_doc(plan: Plan, tops: list[str], tmpl: Plan, n0: str, tsig: Any,
                  tnodes: set[str], topic: str, partitions: int
                  ) -> tuple[dict[str, Any], bool]:
    """The plan ``plan`` with each node of ``tops`` (the top of the shared subplan there)
    replaced by a source of ``topic``, renamed back by a project where its names differ."""
    tinfo = tmpl.info[n0]
    tnames = list(tinfo.names or (c for c, _ in tinfo.columns))
    schema = [{"name": nm, "type": t} for nm, (_, t) in zip(tnames, tinfo.columns)]
    event_time = _event_time(tmpl, n0, tnodes, tnames)
    sigs = node_signatures(plan)
    taken = {nid.lower() for nid in plan.nodes}
    replaced: dict[str, list[dict[str, Any]]] = {}
    unions = any(node.step == "union" for node in plan.nodes.values())
    did_rename = False
    for n in tops:
        info = plan.info[n]
        names = list(info.names or (c for c, _ in info.columns))
        src = {"id": n, "step": "source", "version": 1, "topic": topic,
               "partitions": partitions, "format": "json", "role": "stream",
               "schema": schema}
        if event_time:
            src["event_time"] = event_time
        # Columns are read by name: another order needs no project, but for a union,
        # which lines its inputs up by position.
        if names == tnames or (sorted(names) == sorted(tnames) and not unions):
            replaced[n] = [src]
            continue
        did_rename = True
        by_token: dict[str, str] = {}
        for nm in tnames:
            by_token.setdefault(tsig[nm.lower()], nm)
        src["id"] = _unique(f"{n}_shared", taken)
        cols = [{"name": nm, "expr": _quote(by_token[sigs[n].columns[nm.lower()]])}
                for nm in names]
        replaced[n] = [src, {"id": n, "step": "project", "version": 1,
                             "inputs": [src["id"]], "columns": cols}]
    docs: list[dict[str, Any]] = []
    for nid, node in plan.nodes.items():
        docs.extend(replaced.get(nid) or [node_doc(node)])
    # Keep what the sink still reads: the old prefix goes, a branch reading part of it stays.
    by_id = {d["id"]: d for d in docs}
    keep: set[str] = set()
    stack = [plan.sink_id]
    while stack:
        nid = stack.pop()
        if nid not in keep:
            keep.add(nid)
            stack.extend(by_id[nid].get("inputs", ()))
    return plan_doc(plan, [d for d in docs if d["id"] in keep]), did_rename


def _event_time(tmpl: Plan, n0: str, nodes: set[str], names: list[str]
                ) -> dict[str, str] | None:
    """The event time a source of the shared output declares: a column that carries the
    subplan's watermark, with the longest watermark delay of the sources it reads."""
    marks = tmpl.info[n0].watermarks
    col = next((nm for nm in names if nm.lower() in marks), None)
    if col is None:
        return None
    delays = [tmpl.nodes[n].event_time.watermark for n in nodes  # type: ignore[attr-defined]
              if tmpl.nodes[n].step == "source" and
              tmpl.nodes[n].event_time is not None]  # type: ignore[attr-defined]
    if not delays:
        return None
    return {"column": col, "watermark": max(delays, key=lambda d: duration_seconds(d) or 0)}


# -- a fleet directory ---------------------------------------------------------------------------


def optimize_dir(root: str, out_dir: str) -> Optimized:
    """Optimize the fleet under ``root`` into ``out_dir`` (which must be empty or absent):
    unchanged queries are copied as they were (a job with the helper modules it may
    import), rewritten ones written as JSON plans at their path (a ``.sql`` or ``.py`` one
    as ``.json``), shared queries under ``_shared/``."""
    from compat.fleet.graph import load_fleet

    fleet = load_fleet(root)
    dest = Path(out_dir)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise FleetError("the output folder is not empty", file=out_dir,
                         expected="an empty or new folder",
                         found="a file" if not dest.is_dir() else "files in it")
    if dest.resolve() == Path(root).resolve():
        raise FleetError("the output folder is the fleet itself", file=out_dir,
                         expected="another folder", found=root)
    result = optimize({name: q.plan for name, q in fleet.queries.items()})
    dest.mkdir(parents=True, exist_ok=True)
    taken = {q.path.lower() for q in fleet.queries.values()}
    for name, q in fleet.queries.items():
        target = dest / q.path
        target.parent.mkdir(parents=True, exist_ok=True)
        if name not in result.docs:
            shutil.copyfile(Path(root) / q.path, target)
            continue
        if not q.path.lower().endswith(".json"):  # a SQL script or a job, rewritten
            rel = _unique_path(q.path.rsplit(".", 1)[0] + ".json", taken)
            target = dest / rel
        _write(target, result.docs[name])
    for rel in fleet.helpers:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(root) / rel, dest / rel)
    for name, doc in result.docs.items():
        if name in fleet.queries:
            continue
        rel = _unique_path(f"{SHARED_DIR}/{name}.json", taken)
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        _write(dest / rel, doc)
    return result


def _unique_path(rel: str, taken: set[str]) -> str:
    stem, k, out = rel[:-5], 1, rel
    while out.lower() in taken:
        k += 1
        out = f"{stem}_{k}.json"
    taken.add(out.lower())
    return out


def _write(path: Path, doc: dict[str, Any]) -> None:
    path.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def summary(result: Optimized, out_dir: str | None = None) -> list[str]:
    """What ``theseus fleet optimize`` prints."""
    lines = []
    for rw in result.rewrites:
        sh = rw.shared
        head = (f"shared {sh.short} ({sh.steps} steps over {', '.join(sh.topics)}): "
                f"query {rw.query}{' (new)' if rw.new_query else ''} writes {rw.topic} "
                f"({rw.partitions} partitions)")
        lines.append(head)
        for q, n in rw.consumers:
            how = ", renaming its columns" if q in rw.renamed else ""
            lines.append(f"  {q}: '{n}' now reads {rw.topic}{how}")
    for sh, reason in result.skipped:
        lines.append(f"not shared {sh.short} ({', '.join(sh.queries)}): {reason}")
    if not result.rewrites:
        lines.append("nothing to share")
    else:
        start = result.start_order()
        lines.append("deploy: " + (f"start {', '.join(start)} (in this order), then "
                                   if start else "") +
                     f"migrate {', '.join(result.migrate())} live (their source topic "
                     "changes: theseus fleet check OLD NEW says how)")
    if out_dir is not None:
        lines.append(f"wrote {len(result.plans)} queries to {out_dir} "
                     f"({len(result.docs)} new or rewritten)")
    return lines
