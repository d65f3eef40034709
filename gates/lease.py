"""A migration's lease as everyone but its owner reads it, and what a stale lease lifts.

A query's migration has one owner at a time: the process holding the query's lease,
``<store>/leases/<query>.json`` (written by :mod:`migrate.lease`, the owner's side)::

    {"query": "op_totals", "migration": "m20250101120000-ab12cd",
     "epoch": 4,              # bumped by every new owner: the fencing token
     "seq": 17,               # bumped by every write of the lease (take, renewal, release)
     "holder": {"host": "h1", "pid": 4242, "proc_start": 123456, "started": 1735732800.0,
                "command": "theseus migrate start v3.sql"},
     "heartbeat": 1735732861.5,   # the holder's clock (time.time()) at its last renewal
     "ttl": 15.0,             # seconds without a heartbeat after which the lease is stale
     "released": false}       # the owner ended (done, aborted, refused, failed, stopped)

The lease **holds** while it is not released, its heartbeat is younger than its ``ttl`` and,
when the holder runs on this host, its process is alive (``proc_start``, the process's start
in clock ticks since boot, tells a reused pid apart): a holder killed on this host frees it at
once.  Readers on other hosts compare the heartbeat with their own clock; the owner counts
its own time since its last renewal on a monotonic clock and writes nothing once two thirds
of the TTL passed without a renewal (Kubernetes' leader election: lease 15 s, renew deadline
10 s), so host clocks may disagree by up to a third of the TTL.

**What a stale lease lifts** (decided here, :func:`lifted`; the gated source asks at every
trigger): a gate that names a lease (``GateState.lease``) holds only while that lease holds.
The migrator puts the lease on the gates whose lifting is always safe, and on no other:

=========  ======================================  =========================================
phase      gates in force (old query / shadow)     when the lease goes stale
=========  ======================================  =========================================
check      none (open)                             nothing to lift
shadow     open / open, start gate closed          nothing to lift: the shadow's output is
                                                   discarded, the old query writes
pause      capped at H (leased) / capped at H      both lifted: the old query writes on,
           (leased), once the shadow keeps pace    the shadow reads on; nothing was handed
                                                   over (no control event was written yet)
cut        as in pause, until the caps at C are    lifted as in pause: control events already
           written: shadow capped at C following   written are skipped as data; a query read
           the old query, then the old query       past them is never handed over at them
           capped at C retiring it (not leased)    (below), and ``resume`` pauses again
align      capped at C, retiring (not leased) /    nothing lifts: the old query hands over at
           capped at C, following (not leased)     C by itself and the shadow writes from C
                                                   (its start gate opens on the hand-over)
cutover,   handed over / open                      nothing to lift: the shadow writes
finish
=========  ======================================  =========================================

So an expired lease never reopens the old query past C: its cap at C is never leased, and
before that cap the shadow cannot take over (:func:`gates.state.handed_over` needs the old
query's gate to be the cut that retires it and its acknowledgement *exactly* at the cut, so a
query that read past C while lifted is never handed over).  The owner makes sure a lapse of
its own lease while the pause is in force is never acted on (:mod:`migrate.lease`: a lapse
rewinds the migration to step 3), and ``resume`` catches up from what an expiry left: it
reopens the gates and pauses again from the new high watermarks
(:mod:`migrate.phases.catch_up`).  Not leased either, so a dead migrator holds them until
``resume`` or ``abort``: a cascade's downstream caps at the propagated cut and the upstream's
held output (the chain's cut is one logical point), and the loops' caps of a plan with a
recursive step.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

from compat.errors import GateStateError
from gates.files import read_json

LEASES = "leases"


def lease_path(store: str | os.PathLike[str], query: str) -> Path:
    return Path(store) / LEASES / f"{query}.json"


def lock_path(store: str | os.PathLike[str], query: str) -> Path:
    # a dot file: local to the host (the Kafka store's mirror never publishes it)
    return Path(store) / LEASES / f".{query}.lock"


def this_host() -> str:
    return socket.gethostname()


def read_lease(store: str | os.PathLike[str], query: str) -> dict[str, Any] | None:
    """The lease of ``query``'s migrations, None when no process ever held it; a malformed
    file is one :class:`~compat.errors.GateStateError` naming it."""
    p = lease_path(store, query)
    doc = read_json(p, "lease")
    if doc is None:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("holder"), dict):
        raise GateStateError("malformed lease", file=str(p), pointer="",
                             expected="a JSON object with a holder",
                             found=type(doc).__name__)
    try:
        for k in ("epoch", "seq"):
            doc[k] = int(doc.get(k, 0))
        for k in ("heartbeat", "ttl"):
            doc[k] = float(doc.get(k, 0))
    except (TypeError, ValueError):
        raise GateStateError("malformed lease", file=str(p), pointer=f"/{k}",
                             expected="a number", found=repr(doc.get(k))) from None
    return doc


def proc_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (None: no such process, or
    no /proc): with the pid, it names one process, never a later one that reused the pid."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: count after the last ')'
    fields = stat[stat.rfind(")") + 2:].split()
    try:
        return None if fields[0] == "Z" else int(fields[19])  # a zombie is gone
    except (IndexError, ValueError):
        return None


def process_alive(pid: int, started: int | None = None) -> bool:
    """Process ``pid`` of this host runs (and is the one that started at ``started``)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's: it exists
    now = proc_start(pid)
    if now is None:  # a zombie; or no /proc, where kill(0) is all there is to know
        return not Path("/proc").is_dir()
    return started is None or now == started


def holder_gone(holder: dict[str, Any]) -> bool:
    """The holder ran on this host and its process is gone (killed, or it exited)."""
    if holder.get("host") != this_host():
        return False
    try:
        pid = int(holder.get("pid") or 0)
    except (TypeError, ValueError):
        return True
    started = holder.get("proc_start")
    return not process_alive(pid, int(started) if started is not None else None)


def age(doc: dict[str, Any], now: float | None = None) -> float:
    """Seconds since the lease's last heartbeat."""
    return (time.time() if now is None else now) - float(doc.get("heartbeat", 0))


def why_stale(doc: dict[str, Any] | None, now: float | None = None) -> str | None:
    """Why the lease no longer holds (released, its holder gone, no heartbeat for longer
    than its TTL), or None while it holds."""
    if doc is None:
        return "nobody holds it"
    holder = doc.get("holder") or {}
    if doc.get("released"):
        return f"released by pid {holder.get('pid')} on {holder.get('host')}"
    if holder_gone(holder):
        return f"its holder, pid {holder.get('pid')} on this host, is gone"
    a = age(doc, now)
    if a > float(doc.get("ttl", 0)):
        return f"no heartbeat for {a:.1f} s (its TTL is {float(doc['ttl']):g} s)"
    return None


def describe(doc: dict[str, Any], now: float | None = None) -> str:
    """The holder as a refusal names it: pid, host, command, last heartbeat, expiry."""
    h = doc.get("holder") or {}
    a = age(doc, now)
    left = float(doc.get("ttl", 0)) - a
    text = f"pid {h.get('pid')} on {h.get('host')}"
    if h.get("command"):
        text += f" ({h['command']})"
    text += f", epoch {doc.get('epoch')}, last heartbeat {max(a, 0.0):.1f} s ago"
    why = why_stale(doc, now)
    return text + (f", stale: {why}" if why else f", expires in {max(left, 0.0):.1f} s")


def lifted(store: str | os.PathLike[str], gate: Any, now: float | None = None) -> str | None:
    """Why the gate ``gate`` (a :class:`gates.state.GateState`) no longer holds: it names a
    lease (``gate.lease``) and that lease is stale (the table above); None while it holds,
    and always for a gate that names no lease or is open.  An unreadable lease lifts it:
    lifting a leased gate is always safe, holding it on a broken file would stall the
    output for good."""
    if not getattr(gate, "lease", None) or gate.mode == "open":
        return None
    try:
        doc = read_lease(store, gate.lease)
    except GateStateError as e:
        return f"the lease cannot be read ({e.render()})"
    why = why_stale(doc, now)
    if why is None:
        return None
    migration = (doc or {}).get("migration") or gate.lease
    return f"the lease of migration {migration} is stale: {why}"
