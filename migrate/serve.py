"""``theseus serve``: the operator's view of a store (:mod:`migrate.view`) as a web page
that refreshes itself — the queries with their process, last batch and lag, their
migrations with phase, owner and backfill, the recent migrations, and the fleet picture
of the plans the queries run (``compat.fleet.show``'s drawing).

Read only and bound to 127.0.0.1 alone: the page shows host names, pids and file paths and
has no authentication, so it is not offered to the network (a tunnel, ``ssh -L``, brings it
to another machine).  Only ``GET``/``HEAD`` of ``/`` (the page) and ``/status.json``
(``theseus status --format json``) are answered; every look reads the store and asks the
brokers afresh.  The page refreshes itself with ``<meta http-equiv="refresh">``: no script.
"""

from __future__ import annotations

import html
import json
import signal
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from compat.errors import RuntimeFailure, TheseusError
from compat.fleet.graph import load_fleet_files
from compat.fleet.show import describe, svg
from migrate.history import entry, migrations_of, when
from migrate.protocol import TERMINAL
from migrate.store import DirectoryStore
from migrate.view import (
    Heads,
    ago,
    alive_text,
    batch_text,
    lag_text,
    owner_text,
    query_names,
    snapshot,
)

HOST = "127.0.0.1"
#: the migrations the page lists, newest first
RECENT = 20


def fleet_picture(store: DirectoryStore, names: list[str]) -> tuple[str, str]:
    """(the drawing of the global plan of the plans the queries run, "") or ("", why
    not): a topic one query writes and another reads is an edge, as for a fleet folder."""
    files = {}
    for q in names:
        try:
            files[f"queries/{q}/plan.json"] = store.plan_path(store.live_instance(q)) \
                .read_bytes()
        except OSError:
            continue  # a query without a recorded plan is not drawn
    if not files:
        return "", "no plans recorded"
    try:
        return svg(describe(load_fleet_files(str(store), files))), ""
    except TheseusError as e:
        return "", e.render()


def recent(store: DirectoryStore, names: list[str]) -> list[dict[str, Any]]:
    rows = [dict(entry(m), query=q) for q in names for m in migrations_of(store, q)]
    rows.sort(key=lambda e: e["started_at"] or 0.0, reverse=True)
    return rows[:RECENT]


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _bar(p: dict[str, Any]) -> str:
    pct = max(0.0, min(100.0, 100.0 * p["fraction"]))
    since = f" (+{p['arrived']:,} since)" if p.get("arrived") else ""
    return (f'<div class="bar" data-fraction="{p["fraction"]:.4f}"><span style="width:'
            f'{pct:.1f}%"></span></div><small>backfill {pct:.0f}%: {p["read"]:,}/'
            f'{p["total"]:,} records{since}</small>')


def _migration_cell(mv: dict[str, Any] | None, now: float) -> str:
    if not mv:
        return '<td class="migration">—</td>'
    if "id" not in mv:
        return f'<td class="migration error">{_e(mv.get("error"))}</td>'
    step = f"{mv['step']}. " if mv.get("step") is not None else ""
    if mv["phase"] in TERMINAL:
        return (f'<td class="migration" data-phase="{_e(mv["phase"])}"><code>{_e(mv["id"])}'
                f"</code> {_e(mv['phase'])} {_e(ago(mv.get('ended_at'), now))}</td>")
    parts = [f'<code>{_e(mv["id"])}</code> <b class="phase">{_e(step + mv["phase"])}</b> '
             f'({_e(mv["kind"] or "undecided")}) <span class="owner">'
             f'{_e(owner_text(mv.get("owner"), now))}</span>',
             '<ol class="phases">' + "".join(
                 f'<li>{_e((str(p["step"]) + ". ") if p["step"] is not None else "")}'
                 f'{_e(p["phase"])}</li>' for p in mv["phases"]) + "</ol>"]
    if mv.get("shadow"):
        s = mv["shadow"]
        parts.append(f'<div class="shadow">shadow <code>{_e(s["instance"])}</code>: '
                     f'{_e(alive_text(s))}</div>')
    if mv.get("progress"):
        parts.append(_bar(mv["progress"]))
    if mv.get("error"):
        parts.append(f'<div class="error">{_e(mv["error"])}</div>')
    return (f'<td class="migration" data-phase="{_e(mv["phase"])}">' + "".join(parts) +
            "</td>")


def _query_row(q: dict[str, Any], now: float) -> str:
    alive = {True: "true", False: "false", None: "unknown"}[q["alive"]]
    plan = q["plan"]
    lag = "" if q["lag"] is None else str(q["lag"])
    mv = q["migration"]
    phase = mv.get("phase", "") if mv else ""
    return (f'<tr class="query" data-query="{_e(q["query"])}" data-alive="{alive}" '
            f'data-lag="{_e(lag)}" data-phase="{_e(phase)}">'
            f'<td><b>{_e(q["query"])}</b>'
            + (f'<br><small>instance {_e(q["instance"])}</small>'
               if q["instance"] != q["query"] else "") + "</td>"
            f'<td>{_e(q["status"])}</td>'
            f'<td class="alive {alive}">{_e(alive_text(q))}</td>'
            f'<td><code>{_e(plan["file"] or plan["recorded"])}</code><br>'
            f'<small>{_e(plan["digest"] or "no plan recorded")}</small></td>'
            f'<td>{_e(batch_text(q, now))}</td>'
            f'<td class="lag">{_e("not running" if q["alive"] is False else lag_text(q))}</td>'
            + _migration_cell(mv, now) + "</tr>")


def _history_row(e: dict[str, Any]) -> str:
    old, new = e["plans"]["old"], e["plans"]["new"]
    c = e["counts"] or {}
    counts = (f"{c.get('corrected', 0)} corrected, {c.get('added', 0)} added, "
              f"{c.get('deleted', 0)} deleted" if c else "")
    took = "" if e["seconds"] is None else f"{e['seconds']:g} s"
    cut = "; ".join(f"{t} " + " ".join(f"{p}:{o}" for p, o in sorted(
        ps.items(), key=lambda kv: int(kv[0]))) for t, ps in sorted((e["cut"] or {}).items()))
    return (f'<tr class="past" data-migration="{_e(e["id"])}" data-outcome="{_e(e["outcome"])}">'
            f'<td><code>{_e(e["id"])}</code></td><td>{_e(e["query"])}</td>'
            f'<td>{_e(e["outcome"])}'
            + (f" (rollback of {_e(e['rollback_of'])})" if e["rollback_of"] else "") +
            f'</td><td>{_e(when(e["started_at"]))}</td>'
            f'<td>{took}</td>'
            f'<td>{_e(e["verdict"] or "")}</td>'
            f'<td><code>{_e(old["file"] or old["recorded"] or "")}</code> → '
            f'<code>{_e(new["file"] or new["recorded"])}</code></td>'
            f'<td>{_e(cut)}</td><td>{_e(counts)}</td></tr>')


STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #263238; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 24px; }
table { border-collapse: collapse; }
td, th { border-bottom: 1px solid #eceff1; padding: 6px 10px; text-align: left;
  vertical-align: top; font-size: 13px; }
.alive.true { color: #2e7d32; } .alive.false { color: #c62828; } .alive.unknown { color: #757575; }
.bar { width: 220px; height: 10px; background: #eceff1; border-radius: 5px; margin: 4px 0; }
.bar span { display: block; height: 100%; background: #1565c0; border-radius: 5px; }
.phases { margin: 2px 0; padding-left: 18px; color: #546e7a; font-size: 12px; }
.phases li { display: inline; margin-right: 10px; }
.error { color: #c62828; } .pane { border: 1px solid #cfd8dc; border-radius: 8px;
  padding: 12px; overflow: auto; }
svg text { font-family: system-ui, sans-serif; }
"""


def render_page(doc: dict[str, Any], history: list[dict[str, Any]], picture: str,
                no_picture: str, refresh: float) -> str:
    """The page for one look at the store."""
    now = float(doc["at"])
    queries = doc["queries"]
    moving = sum(1 for q in queries if q["migration"] and
                 q["migration"].get("phase") not in TERMINAL)
    # the fleet picture's boxes outlined by what their process is doing
    marks = []
    for q in queries:
        mv = q["migration"] or {}
        colour = "#ef6c00" if mv.get("phase") not in (None, *TERMINAL) else \
            {True: "#2e7d32", False: "#c62828", None: "#9e9e9e"}[q["alive"]]
        name = json.dumps(q["query"])
        marks.append(f"g.query[data-query={name}] > rect:first-of-type "
                     f"{{ stroke: {colour}; stroke-width: 4; }}")
    rows = "".join(_query_row(q, now) for q in queries) or \
        '<tr><td colspan="7">no queries in this store</td></tr>'
    past = "".join(_history_row(e) for e in history) or \
        '<tr><td colspan="9">none</td></tr>'
    fleet = f'<div class="pane">{picture}</div>' if picture else \
        f'<p class="nofleet">{_e(no_picture)}</p>'
    at = time.strftime("%H:%M:%S UTC", time.gmtime(now))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="{refresh:g}">
<title>theseus: {_e(doc["store"])}</title>
<style>{STYLE}{chr(10).join(marks)}</style></head><body>
<h1>theseus — <code>{_e(doc["store"])}</code></h1>
<p class="summary" data-at="{now}">{len(queries)} quer{"y" if len(queries) == 1 else "ies"},
{moving} migrating · as of {at} on {_e(doc["host"])} · this page refreshes itself every
{refresh:g} s and changes nothing</p>
<h2>Queries</h2>
<table class="queries"><tr><th>query</th><th>status</th><th>process</th><th>plan</th>
<th>last batch</th><th>lag</th><th>migration</th></tr>
{rows}</table>
<h2>Migrations</h2>
<table class="migrations"><tr><th>migration</th><th>query</th><th>outcome</th>
<th>started</th><th>took</th><th>verdict</th><th>plans</th><th>cut</th>
<th>reconciliation</th></tr>
{past}</table>
<h2>Fleet</h2>
<p>The plans the queries run, as one global plan: an edge is a topic one query writes and
another reads. A box is outlined green while its query runs, red when it does not, orange
while it migrates.</p>
{fleet}
</body></html>
"""


def look(store: DirectoryStore, refresh: float, timeout: float) -> str:
    """One look at the store, as the page."""
    doc = snapshot(store, Heads(timeout))
    names = [q["query"] for q in doc["queries"]] or query_names(store)
    picture, why = fleet_picture(store, names)
    return render_page(doc, recent(store, names), picture, why, refresh)


def make_server(store: DirectoryStore, port: int = 8470, refresh: float = 2.0,
                timeout: float = 2.0) -> ThreadingHTTPServer:
    """The server (not started), on 127.0.0.1:``port`` (0: a free port)."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "theseus"

        def _send(self, code: int, body: str, kind: str, head: bool = False) -> None:
            data = body.encode("utf-8")
            self.send_response(code)
            self.send_header("Content-Type", f"{kind}; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if not head:
                self.wfile.write(data)

        def _answer(self, head: bool) -> None:
            path = self.path.split("?", 1)[0]
            try:
                if path == "/":
                    self._send(200, look(store, refresh, timeout), "text/html", head)
                elif path == "/status.json":
                    self._send(200, json.dumps(snapshot(store, Heads(timeout)), indent=2),
                               "application/json", head)
                else:
                    self._send(404, "not found: the page is /, its data /status.json\n",
                               "text/plain", head)
            except TheseusError as e:  # a malformed record: say which, keep serving
                self._send(500, f"theseus: error: {e.render()}\n", "text/plain", head)

        def do_GET(self) -> None:  # noqa: N802 (http.server's names)
            self._answer(False)

        def do_HEAD(self) -> None:  # noqa: N802
            self._answer(True)

        def _refuse(self) -> None:
            self.send_response(HTTPStatus.METHOD_NOT_ALLOWED)
            self.send_header("Allow", "GET, HEAD")
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_POST = do_PUT = do_DELETE = do_PATCH = _refuse  # noqa: N815 (read only)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass  # one line per refresh would drown what the command prints

    try:
        return ThreadingHTTPServer((HOST, port), Handler)
    except OSError as e:
        raise RuntimeFailure(f"cannot listen on {HOST}:{port}: {e.strerror or e}",
                             expected="a free port (--port, 0 for any)",
                             found=str(port)) from None


def serve(store: DirectoryStore, port: int = 8470, refresh: float = 2.0,
          echo: Callable[[str], None] = print) -> int:
    """Serve until Ctrl-C or SIGTERM; returns the exit code (0)."""
    server = make_server(store, port, refresh)
    bound = server.server_address[1]
    done = threading.Event()
    worker = threading.Thread(target=server.serve_forever, daemon=True)
    worker.start()
    previous = {s: signal.signal(s, lambda *_: done.set())
                for s in (signal.SIGINT, signal.SIGTERM)}
    echo(f"theseus: serving {store} at http://{HOST}:{bound}/ (read only; Ctrl-C stops)")
    try:
        while not done.wait(0.5):
            pass
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        server.shutdown()
        server.server_close()
    echo("theseus: stopped serving")
    return 0
