"""What the migrator shows while it works: one live line on a terminal, plain lines in logs.

On a terminal the shadow's backfill is one progress bar rewritten in place (records read
of the records to read, rate, ETA), then the phases; each phase stays on its own line.  When
the output is not a terminal (CI logs, a file), the live line is printed as a plain line at
most every ``every`` seconds (and when its kind changes), never every half second.

:func:`backfill` measures the shadow's progress from the store (its acknowledged offsets)
and the brokers' high watermarks, against the backfill recorded at step 2: it never goes
back.  ``theseus migrate status --watch`` (:func:`watch`) uses it as well, and prints every
phase from the record's history, however short (:func:`phase_log`).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from typing import IO, Any

from compat.check import load_plan
from compat.errors import GateStateError, TheseusError
from compat.model import Plan
from compat.steps import Source
from gates.broker import watermarks
from gates.state import Offsets, acked_offsets
from migrate import sides
from migrate.protocol import PHASES, TERMINAL, step_number
from migrate.record import Migration, current, int_offsets, json_offsets

BAR = 24


def fmt_seconds(s: float) -> str:
    s = int(max(0, s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else \
        f"{s // 60}:{s % 60:02d}"


class Rate:
    """Records per second over a sliding window of samples (done, at)."""

    def __init__(self, window: float = 10.0) -> None:
        self.window = window
        self.samples: list[tuple[float, int]] = []

    def add(self, done: int, at: float | None = None) -> float:
        at = time.monotonic() if at is None else at
        self.samples.append((at, done))
        while len(self.samples) > 2 and at - self.samples[0][0] > self.window:
            self.samples.pop(0)
        (t0, d0), (t1, d1) = self.samples[0], self.samples[-1]
        return (d1 - d0) / (t1 - t0) if t1 > t0 else 0.0


def bar_line(done: int, total: int, rate: float, width: int = BAR,
             arrived: int | None = None) -> str:
    """``backfill [#########...........]  38%  1,234,000/3,250,000 records  45,000/s  ETA 0:44``
    (``arrived``: ``  +1,200 since`` — records written to the sources since the backfill's
    head was taken, which the shadow reads once near the head)"""
    frac = 1.0 if total <= 0 else min(1.0, done / total)
    filled = int(round(frac * width))
    eta = "ETA --" if rate <= 0 else f"ETA {fmt_seconds((total - done) / rate)}"
    if done >= total:
        eta = "at the head"
    since = f"  +{arrived:,} since" if arrived else ""
    return (f"backfill [{'#' * filled}{'.' * (width - filled)}] {frac * 100:3.0f}%  "
            f"{done:,}/{total:,} records  {rate:,.0f}/s  {eta}{since}")


class Progress:
    """``progress(line)`` prints a line that stays; ``progress.live(text)`` the live line."""

    def __init__(self, out: IO[str] | None = None, tty: bool | None = None,
                 every: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.out = out or sys.stdout
        self.tty = self.out.isatty() if tty is None else tty
        if os.environ.get("THESEUS_PLAIN_PROGRESS"):
            self.tty = False
        self.every = every
        self.clock = clock
        self._shown = ""  # what the live line shows now (terminal)
        self._last: tuple[float, str] = (-1e18, "")  # last plain live line: when, kind

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def __call__(self, line: str) -> None:
        if self.tty and self._shown:
            self._write("\r\x1b[2K")  # clear the live line; it comes back on the next live()
            self._shown = ""
        self._write(line + "\n")

    def live(self, text: str, kind: str = "") -> None:
        if self.tty:
            cols = shutil.get_terminal_size((120, 20)).columns
            text = text[:max(10, cols - 1)]
            if text != self._shown:
                self._write("\r\x1b[2K" + text)
                self._shown = text
            return
        now = self.clock()
        at, last_kind = self._last
        if kind != last_kind or now - at >= self.every:
            self._write(text + "\n")
            self._last = (now, kind)

    def close(self) -> None:
        if self.tty and self._shown:
            self._write("\n")
            self._shown = ""


def backfill_range(plan: Plan, low: Offsets, high: Offsets) -> dict[str, Any]:
    """What the shadow of ``plan`` reads as its backfill, taken at step 2 before it starts
    (the record's ``backfill``): ``from`` where it starts in each partition of its stream
    sources' topics (the low watermark, or the high one for a source that starts at the
    latest offsets), ``to`` the high watermarks then."""
    latest = {n.topic for n in plan.nodes.values() if isinstance(n, Source)
              and n.starting_offsets == "latest"}
    earliest = {n.topic for n in plan.nodes.values() if isinstance(n, Source)
                and n.starting_offsets != "latest"}
    start = {t: dict(high[t] if t in latest and t not in earliest else low.get(t, {}))
             for t in high}
    return {"from": json_offsets(start), "to": json_offsets(high)}


def backfill_counts(rng: dict[str, Any], acked: Offsets, high: Offsets | None = None
                    ) -> tuple[int, int, int | None]:
    """(records of the backfill read, records of the backfill, records written since) of a
    shadow whose backfill is ``rng`` (:func:`backfill_range`) and whose acknowledged
    offsets are ``acked``, against the high watermarks ``high`` now (None: not asked).

    The whole is fixed: the records between ``from`` and ``to``.  The part read counts, in
    every partition, the acknowledged offset held between the two; an acknowledgement never
    moves back (``gates.state``), so the fraction never decreases, however fast the head
    grows.  What arrived past ``to`` is counted apart: the shadow reads it once it is near
    the head (step 3 says how near)."""
    start, end = int_offsets(rng.get("from") or {}), int_offsets(rng.get("to") or {})
    done = total = 0
    for t, parts in end.items():
        for p, hi in parts.items():
            lo = min(start.get(t, {}).get(p, 0), hi)
            total += hi - lo
            done += min(max(acked.get(t, {}).get(p, lo), lo), hi) - lo
    arrived = None if high is None else sum(
        max(0, o - end.get(t, {}).get(p, 0)) for t, ps in high.items() if t in end
        for p, o in ps.items())
    return done, total, arrived


def backfill(store: Any, m: Migration, deadline: Any = 10.0
             ) -> tuple[int, int, int | None]:
    """:func:`backfill_counts` of the migration ``m``'s shadow, from the store and the
    brokers' high watermarks; a record without its backfill (an earlier Theseus) counts
    against the head now."""
    inst = sides.source_gate(store, m.new_instance)
    try:
        done = acked_offsets(store.root, inst)
    except GateStateError:
        done = {}
    topics = sorted((m.backfill.get("to") or {}).keys()) or \
        sides.source_topics(load_plan(m.new_plan))
    high = watermarks(m.bootstrap, topics, deadline)
    rng = m.backfill or {"to": json_offsets(high)}
    return backfill_counts(rng, done, high)


def phase_log(m: Migration) -> list[str]:
    """Every phase ``m`` went through, in order: the phases of its history (each recorded
    before it acted, a phase entered again by a resume twice), then the recorded phase when
    the history does not end with it yet (the runner records the next phase before it
    enters it; a refusal records ``refused`` alone).  A watcher that polls prints from
    here, so a phase shorter than its interval is printed all the same."""
    log = [str(h[0]) for h in m.history if h and h[0] in PHASES]
    if not log or log[-1] != m.phase:
        log.append(m.phase)
    return log


def phase_line(m: Migration, phase: str) -> str:
    n = step_number(m.kind, phase, getattr(m, "dry_run", False))
    return f"[{m.id}] {n}. {phase}" if n is not None else f"[{m.id}] {phase}"


def describe(m: Migration) -> str:
    """One line about a migration's phase, as ``migrate status --watch`` shows it."""
    text = phase_line(m, m.phase)
    if m.phase == "cutover" and m.reconciling and not m.counts:
        text += " (reconciling at the hand-over)"
    if m.counts:
        c = m.counts
        text += (f" (reconciled: {c.get('corrected', 0)} corrected, {c.get('added', 0)} "
                 f"added, {c.get('deleted', 0)} deleted, {c.get('matched', 0)} already right)")
    if m.error:
        text += f" (error: {m.error})"
    return text


def watch(store: Any, query: str, progress: Progress, interval: float = 1.0,
          sleep: Callable[[float], None] = time.sleep) -> Any:
    """Follow ``query``'s current migration until it ends (done, aborted, refused): one
    line per phase it passes through (from its history: none is skipped, however short),
    the current one with what is known of it, and while the shadow backfills, its
    progress bar on the live line.  Returns the last migration record read."""
    rate = Rate()
    printed = 0  # phases of the log printed
    shown = ""  # the line of the current phase as last printed
    head: dict[str, Any] = {}  # a record without its backfill: the head first seen
    following = ""
    while True:
        m: Migration = current(store, query)
        if m.id != following:  # the first look, or another migration began meanwhile
            following, printed, shown = m.id, 0, ""
            head.clear()
        log = phase_log(m)
        for phase in log[printed:-1]:
            progress(phase_line(m, phase))
        line = describe(m)
        if printed < len(log) or line != shown:
            progress(line)
            shown = line
        printed = len(log)
        if m.phase in TERMINAL:
            return m
        if m.phase in ("shadow", "pause") and m.new_instance and m.bootstrap and \
                not m.cut_from and not any(h[0] == "steady" for h in m.history):
            try:
                if not m.backfill and not head:
                    head.update(backfill_range(load_plan(m.new_plan), {}, watermarks(
                        m.bootstrap, sides.source_topics(load_plan(m.new_plan)), 5.0)))
                if not m.backfill:
                    m.backfill = head
                done, total, arrived = backfill(store, m, 5.0)
                progress.live("  " + bar_line(done, total, rate.add(done), arrived=arrived),
                              "backfill")
            except TheseusError as e:  # a broker that does not answer: say so, keep going
                progress.live(f"  backfill: {e.message}", "error")
        sleep(interval)
