"""What runs, as an operator sees it: every query of a store with its plan, its host and
whether that process is alive, its last batch and lag, and its migration with phase, owner
and progress (``theseus status``, ``theseus migrate status``, ``theseus serve``).

Read only: nothing here writes to the store or to Kafka.

**Liveness.**  A host records its host name and pid when it starts, and a heartbeat
(``heartbeat_at``, every ``heartbeat_every`` seconds, :mod:`migrate.run`) while it runs.  A
status that says the query stopped or failed is believed first.  On the host the process
runs on, its pid decides: alive while the process exists (a heartbeat can be late on a busy
machine, a pid cannot lie).  From another host only the heartbeat can: alive while it is
younger than :data:`MISSED_BEATS` beats (the two hosts' clocks are taken to agree within a
beat).  A status without a heartbeat, on another host, is "unknown".

**Last batch and lag.**  The gated sources acknowledge, whenever Spark plans a batch, the
offsets below which everything is committed, sink included (:mod:`gates.state`): the
acknowledgement's time is when the last batch that read something was committed, and the
lag is the brokers' high watermarks now minus those offsets, summed over the partitions of
the query's stream sources.  Without an answer from the broker in time, or before the first
acknowledgement, the lag is unknown and the view says why.

**Owner.**  A migration's owner is the process holding its query's lease
(:mod:`gates.lease`): :func:`owner_of` is the one place that reads it.
"""

from __future__ import annotations

import hashlib
import json
import socket
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from compat.check import load_plan
from compat.errors import TheseusError
from gates.broker import watermarks
from gates.lease import read_lease, why_stale
from gates.state import Offsets, acked_offsets, read_ack
from migrate import sides
from migrate.progress import backfill_counts, bar_line, phase_log
from migrate.protocol import TERMINAL, step_number
from migrate.record import Migration, current, source_changed, user_source
from migrate.services.processes import pid_alive
from migrate.store import DirectoryStore, open_store, read_json

#: heartbeats a host may miss before another host takes it for dead
MISSED_BEATS = 3
FORMAT = "theseus.status/1"
MIGRATION_FORMAT = "theseus.migration-status/1"


def existing_store(spec: str) -> DirectoryStore:
    """The store at ``spec`` to look at: a directory that does not exist is a mistake
    (a typo in ``--state``), not an empty store, and is not created."""
    if not spec.startswith("kafka://") and not Path(spec).is_dir():
        raise TheseusError("no store here", file=spec,
                           expected="a store directory written by theseus run (--state)",
                           found="no such directory" if not Path(spec).exists() else "a file")
    return open_store(spec)


def owner_of(store: DirectoryStore, m: Migration) -> dict[str, Any] | None:
    """The owner of migration ``m``: the holder of its query's lease (:mod:`gates.lease`)
    while the lease names ``m`` (or the cascade ``m`` is part of) — host, pid, command,
    epoch, last heartbeat — and whether it still holds (``stale``: why not; a migration
    whose owner died shows its last holder, stale).  None for a migration that ended, or
    one no process ever took (an older Theseus): the view shows "unknown"."""
    if m.phase in TERMINAL:
        return None
    try:
        doc = read_lease(store.root, m.query)
    except TheseusError:
        return None
    if doc is None or doc.get("migration") not in (m.id, m.cascade or m.id):
        return None
    h = doc.get("holder") or {}
    return {"host": h.get("host"), "pid": h.get("pid"), "command": h.get("command"),
            "epoch": doc.get("epoch"), "heartbeat_at": doc.get("heartbeat"),
            "ttl": doc.get("ttl"), "stale": why_stale(doc)}


class Heads:
    """The brokers' high watermarks, asked once per broker and topic for one look at the
    store; a broker that does not answer within ``timeout`` is asked no more (its error is
    the reason every lag it would give is unknown)."""

    def __init__(self, timeout: float = 3.0, bootstrap: str | None = None) -> None:
        self.timeout = timeout
        self.bootstrap = bootstrap  # instead of the one each query recorded
        self.seen: dict[tuple[str, str], dict[int, int]] = {}
        self.failed: dict[str, str] = {}

    def high(self, bootstrap: str, topics: list[str]) -> Offsets:
        bs = self.bootstrap or bootstrap
        if not bs:
            raise TheseusError("no broker recorded", expected="the bootstrap the query "
                               "runs with", found="none (give --bootstrap)")
        if bs in self.failed:
            raise TheseusError(self.failed[bs])
        todo = [t for t in topics if (bs, t) not in self.seen]
        if todo:
            try:
                for t, ps in watermarks(bs, todo, self.timeout).items():
                    self.seen[(bs, t)] = ps
            except TheseusError as e:
                self.failed[bs] = f"the broker at {bs} did not answer: {e.message}"
                raise TheseusError(self.failed[bs]) from None
        return {t: self.seen[(bs, t)] for t in topics}


def query_names(store: DirectoryStore) -> list[str]:
    """Every query of the store, by name: a folder under ``queries/`` that is not an
    instance of another query (a migration's ``<query>.g<n>``, whose plan is that
    query's)."""
    root = store.root / "queries"
    if not root.is_dir():
        return []
    names = []
    for d in sorted(root.iterdir(), key=lambda p: p.name):
        if not d.is_dir():
            continue
        try:
            owner = store.status(d.name).get("plan_query")
        except TheseusError:
            owner = None  # unreadable: shown as such with the query
        if owner is None:
            owner = _plan_query(d / "plan.json")
        if owner and owner != d.name:
            continue
        names.append(d.name)
    return names


def _plan_query(path: Path) -> str | None:
    try:
        doc = read_json(path, "plan")
    except (FileNotFoundError, TheseusError):
        return None
    return str(doc.get("query")) if isinstance(doc, dict) and doc.get("query") else None


def liveness(st: dict[str, Any], here: str | None = None, now: float | None = None
             ) -> tuple[bool | None, str]:
    """(alive: True, False or None when nothing says, how that was decided) of the host
    whose status is ``st``."""
    here = socket.gethostname() if here is None else here
    now = time.time() if now is None else now
    if not st:
        return None, "no status recorded"
    status, host, pid = st.get("status"), st.get("host") or "?", st.get("pid")
    if status in ("stopped", "failed"):
        return False, status
    if host == here and pid:
        if pid_alive(int(pid)):
            return True, f"pid {pid} on this host"
        return False, f"pid {pid} on this host is gone ({status or 'no status'} recorded)"
    beat, every = st.get("heartbeat_at"), float(st.get("heartbeat_every") or 5.0)
    if beat is None:
        return None, f"pid {pid} on {host}: no heartbeat recorded"
    age = max(0.0, now - float(beat))
    alive = age <= MISSED_BEATS * every
    return alive, (f"pid {pid} on {host}, heartbeat {age:.0f} s ago" +
                   ("" if alive else f" (more than {MISSED_BEATS} beats of {every:g} s)"))


def last_batch(store: DirectoryStore, instance: str, st: dict[str, Any]
               ) -> dict[str, Any] | None:
    """The instance's last batch: its id as the host last said (heartbeat, or when it
    stopped) and when the last batch that read input was committed (acknowledgements)."""
    try:
        doc = read_ack(store.root, instance)
    except TheseusError:
        doc = {"topics": {}}
    times = [float(e["time"]) for e in doc["topics"].values()
             if isinstance(e, dict) and e.get("time") is not None]
    batch = st.get("last_batch")
    batch = int(batch) if isinstance(batch, int) and batch >= 0 else None
    if batch is None and not times:
        return None
    return {"id": batch, "at": max(times) if times else None}


def lag(store: DirectoryStore, instance: str, heads: Heads | None
        ) -> tuple[int | None, str]:
    """(records behind the head over the instance's stream sources, "") or (None, why
    not known)."""
    st = store.status(instance)
    try:
        topics = sides.source_topics(load_plan(str(store.plan_path(instance))))
    except (TheseusError, OSError) as e:
        return None, f"no plan to read its topics from ({getattr(e, 'message', e)})"
    if not topics:
        return 0, ""
    try:
        acked = acked_offsets(store.root, sides.source_gate(store, instance))
    except TheseusError as e:
        return None, f"unreadable acknowledgements: {e.message}"
    missing = [t for t in topics if t not in acked]
    if missing:
        return None, "no batch acknowledged yet"
    if heads is None:
        return None, "the broker was not asked"
    try:
        high = heads.high(str(st.get("bootstrap") or ""), topics)
    except TheseusError as e:
        return None, e.message
    return sum(max(0, o - acked[t].get(p, 0)) for t, ps in high.items()
               for p, o in ps.items()), ""


def digest(path: Path) -> str | None:
    """A short digest of the plan the store records (its canonical JSON), to tell two
    deployed plans apart at a glance."""
    try:
        return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    except OSError:
        return None


def instance_view(store: DirectoryStore, instance: str, heads: Heads | None,
                  here: str | None = None, now: float | None = None) -> dict[str, Any]:
    """One running instance: status, host, liveness, last batch and lag."""
    try:
        st = store.status(instance)
        unreadable = ""
    except TheseusError as e:
        st, unreadable = {}, e.render()
    alive, how = liveness(st, here, now)
    view: dict[str, Any] = {
        "instance": instance, "status": st.get("status") or "unknown",
        "host": st.get("host"), "pid": st.get("pid"), "alive": alive, "liveness": how,
        "heartbeat_at": st.get("heartbeat_at"),
        "last_batch": last_batch(store, instance, st),
    }
    if unreadable:
        view["liveness"] = unreadable
    if alive is not False:  # a host elsewhere without a heartbeat may well be reading
        view["lag"], view["lag_note"] = lag(store, instance, heads)
    else:
        view["lag"], view["lag_note"] = None, "not running"
    return view


def migration_view(store: DirectoryStore, m: Migration, heads: Heads | None,
                   here: str | None = None, now: float | None = None) -> dict[str, Any]:
    """A migration as the view shows it: phase and step, owner, when it started, its
    shadow's liveness and backfill, its cut and reconciliation."""
    started = m.history[0][1] if m.history else None
    ended = m.history[-1][1] if m.history and m.phase in TERMINAL else None
    view: dict[str, Any] = {
        "id": m.id, "phase": m.phase, "step": step_number(m.kind, m.phase, m.dry_run),
        "kind": m.kind, "verdict": m.verdict, "owner": owner_of(store, m),
        "started_at": started, "ended_at": ended, "plan_file": m.plan_file or m.new_plan,
        "cascade": m.cascade, "rollback_of": m.rollback_of, "cut": m.cut,
        "counts": m.counts, "error": m.error,
        "phases": [{"phase": p, "step": step_number(m.kind, p, m.dry_run)} for p in phase_log(m)],
        "shadow": None, "progress": None,
    }
    if m.kind == "shadow" and m.new_instance and m.phase not in TERMINAL:
        view["shadow"] = instance_view(store, m.new_instance, heads, here, now)
        if m.phase in ("shadow", "pause") and m.backfill and not m.cut_from:
            view["progress"] = progress_view(store, m, heads)
    return view


def progress_view(store: DirectoryStore, m: Migration, heads: Heads | None
                  ) -> dict[str, Any]:
    """The shadow's backfill (:func:`migrate.progress.backfill_counts`): read of total, and
    what arrived since it began (None without a broker)."""
    try:
        acked = acked_offsets(store.root, sides.source_gate(store, m.new_instance))
    except TheseusError:
        acked = {}
    high = None
    if heads is not None:
        try:
            high = heads.high(m.bootstrap, sorted(m.backfill.get("to") or {}))
        except TheseusError:
            high = None
    read, total, arrived = backfill_counts(m.backfill, acked, high)
    return {"read": read, "total": total, "arrived": arrived,
            "fraction": 1.0 if total <= 0 else read / total}


def query_view(store: DirectoryStore, query: str, heads: Heads | None,
               here: str | None = None, now: float | None = None) -> dict[str, Any]:
    """One query: the instance that is live, its plan, and its migration (the current one,
    or the last one when it ended)."""
    inst = store.live_instance(query)
    view = instance_view(store, inst, heads, here, now)
    file, source = _safe(lambda: user_source(store, inst)) or ("", "")
    view = {"query": query, **view, "plan": {
        "file": file or None, "digest": digest(store.plan_path(inst)),
        "recorded": str(store.plan_path(inst)), "source_digest": source or None,
        "source_changed": source_changed(file, source)}}
    view["migration"] = None
    if (store.query_dir(query) / "migration").exists():
        try:
            view["migration"] = migration_view(store, current(store, query), heads, here,
                                               now)
        except TheseusError as e:
            view["migration"] = {"error": e.render()}
    return view


def _safe(f: Any) -> Any:
    try:
        return f()
    except TheseusError:
        return None


def snapshot(store: DirectoryStore, heads: Heads | None = None, now: float | None = None
             ) -> dict[str, Any]:
    """The whole view of the store (``theseus status --format json``,
    ``compat/schemas/status.v1.json``) at ``now`` (default: now)."""
    here, now = socket.gethostname(), time.time() if now is None else now
    return {"format": FORMAT, "store": str(store), "host": here, "at": round(now, 3),
            "queries": [query_view(store, q, heads, here, now) for q in query_names(store)]}


def migration_status(store: DirectoryStore, m: Migration, heads: Heads | None = None
                     ) -> dict[str, Any]:
    """``theseus migrate status --format json``: the record as stored, and what the view
    adds (phase log, owner, both queries' liveness and lag, the backfill)."""
    here, now = socket.gethostname(), time.time()
    view = migration_view(store, m, heads, here, now)
    return {"format": MIGRATION_FORMAT, "at": round(now, 3), "record": asdict(m),
            "phases": view["phases"], "owner": view["owner"],
            "old": instance_view(store, m.old_instance, heads, here, now),
            "new": instance_view(store, m.new_instance, heads, here, now)
            if m.new_instance and m.new_instance != m.old_instance else None,
            "progress": view["progress"]}


# -- text -------------------------------------------------------------------------------

def ago(at: float | None, now: float) -> str:
    if at is None:
        return "never"
    s = max(0, int(now - at))
    return f"{s} s ago" if s < 120 else f"{s // 60} min ago" if s < 7200 else \
        f"{s // 3600} h ago"


def alive_text(v: dict[str, Any]) -> str:
    word = {True: "alive", False: "not alive", None: "liveness unknown"}[v["alive"]]
    return word if v["liveness"] == v["status"] else f"{word} ({v['liveness']})"


def lag_text(v: dict[str, Any]) -> str:
    return f"lag {v['lag']:,} records" if v.get("lag") is not None else \
        f"lag unknown ({v.get('lag_note') or 'not known'})"


def batch_text(v: dict[str, Any], now: float) -> str:
    b = v.get("last_batch")
    if not b:
        return "no batch yet"
    name = f"last batch {b['id']}" if b.get("id") is not None else "last batch"
    return f"{name}, input committed {ago(b.get('at'), now)}" if b.get("at") else name


def owner_text(owner: dict[str, Any] | None, now: float) -> str:
    if not owner:
        return "owner unknown"
    beat = owner.get("heartbeat_at")
    return (f"owner pid {owner.get('pid', '?')} on {owner.get('host', '?')}"
            + (f", epoch {owner['epoch']}" if owner.get("epoch") is not None else "")
            + (f", heartbeat {ago(float(beat), now)}" if beat is not None else "")
            + (f" (stale: {owner['stale']})" if owner.get("stale") else ""))


def progress_text(p: dict[str, Any]) -> str:
    return bar_line(p["read"], p["total"], 0.0, arrived=p.get("arrived")).replace(
        "  0/s  ETA --", "")


def migration_lines(mv: dict[str, Any], now: float, indent: str = "  ") -> list[str]:
    if "id" not in mv:
        return [f"{indent}migration: {mv.get('error')}"]
    step = f"{mv['step']}. " if mv.get("step") is not None else ""
    head = f"{indent}migration {mv['id']}: {step}{mv['phase']}"
    if mv["phase"] in TERMINAL:
        return [head + (f" {ago(mv['ended_at'], now)}" if mv.get("ended_at") else "")]
    head += f" ({mv['kind'] or 'undecided'}"
    head += f", verdict {mv['verdict']})" if mv.get("verdict") else ")"
    lines = [head + f", {owner_text(mv.get('owner'), now)}"]
    if mv.get("shadow"):
        s = mv["shadow"]
        lines.append(f"{indent}  shadow {s['instance']}: {alive_text(s)}")
    if mv.get("progress"):
        lines.append(f"{indent}  {progress_text(mv['progress'])}")
    if mv.get("error"):
        lines.append(f"{indent}  error: {mv['error']}")
    return lines


def _source_text(plan: dict[str, Any]) -> str:
    """The user's file's digest as recorded, and whether the file changed since."""
    if not plan.get("source_digest"):
        return ""
    short = plan["source_digest"][:len("sha256:") + 12]
    return f"  (from file {short}" + (", changed since" if plan.get("source_changed")
                                      else "") + ")"


def render_text(doc: dict[str, Any]) -> str:
    now = float(doc["at"])
    queries = doc["queries"]
    moving = sum(1 for q in queries if q["migration"] and
                 q["migration"].get("phase") not in TERMINAL)
    out = [f"store {doc['store']}: " + (
        f"{len(queries)} quer{'y' if len(queries) == 1 else 'ies'}, "
        f"{moving} migrating" if queries else "no queries")]
    for q in queries:
        inst = "" if q["instance"] == q["query"] else f" (instance {q['instance']})"
        out += ["", f"{q['query']}{inst}: {q['status']}, {alive_text(q)}",
                f"  plan {q['plan']['file'] or q['plan']['recorded']}  "
                f"{q['plan']['digest'] or '(no plan recorded)'}{_source_text(q['plan'])}",
                f"  {batch_text(q, now)}, {'not running' if q['alive'] is False else lag_text(q)}"]
        if q["migration"]:
            out += migration_lines(q["migration"], now)
    return "\n".join(out) + "\n"


def render_migration_text(doc: dict[str, Any]) -> list[str]:
    """The lines ``migrate status`` adds to the record's: owner, both queries, progress."""
    now = float(doc["at"])
    lines = [f"  {owner_text(doc['owner'], now)}"]
    for side in ("old", "new"):
        v = doc[side]
        if v is None:
            continue
        tail = "" if v["alive"] is False else f", {lag_text(v)}"
        lines.append(f"  {side} {v['instance']}: {alive_text(v)}{tail}")
    if doc.get("progress"):
        lines.append(f"  {progress_text(doc['progress'])}")
    return lines


def to_json(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2) + "\n"

