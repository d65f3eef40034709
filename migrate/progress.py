"""What the migrator shows while it works: one live line on a terminal, plain lines in logs.

On a terminal the shadow's backfill is one progress bar rewritten in place (records read
of the records to read, rate, ETA), then the phases; each phase stays on its own line.  When
the output is not a terminal (CI logs, a file), the live line is printed as a plain line at
most every ``every`` seconds (and when its kind changes), never every half second.

:func:`backfill` measures the shadow's progress from the store (its acknowledged offsets)
and the brokers' high watermarks; ``theseus migrate status --watch`` uses it as well.
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
from compat.steps import Source
from gates.broker import watermarks
from gates.state import acked_offsets
from migrate.protocol import TERMINAL, step_number
from migrate.record import Migration, current

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


def bar_line(done: int, total: int, rate: float, width: int = BAR) -> str:
    """``backfill [#########...........]  38%  1,234,000/3,250,000 records  45,000/s  ETA 0:44``"""
    frac = 1.0 if total <= 0 else min(1.0, done / total)
    filled = int(round(frac * width))
    eta = "ETA --" if rate <= 0 else f"ETA {fmt_seconds((total - done) / rate)}"
    if done >= total:
        eta = "at the head"
    return (f"backfill [{'#' * filled}{'.' * (width - filled)}] {frac * 100:3.0f}%  "
            f"{done:,}/{total:,} records  {rate:,.0f}/s  {eta}")


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


def backfill(store: Any, m: Any, topics: list[str], deadline: Any = 10.0
             ) -> tuple[int, int]:
    """(records the shadow has read, records in its source topics now), from its
    acknowledged offsets and the high watermarks."""
    try:
        done = acked_offsets(store.root, m.new_instance)
    except GateStateError:
        done = {}
    high = watermarks(m.bootstrap, topics, deadline)
    total = sum(sum(ps.values()) for ps in high.values())
    read = sum(min(o, high.get(t, {}).get(p, 0)) for t, ps in done.items() if t in high
               for p, o in ps.items())
    return read, total


def describe(m: Any) -> str:
    """One line about a migration's phase, as ``migrate status --watch`` shows it."""
    n = step_number(m.kind, m.phase, m.dry_run)
    text = f"[{m.id}] {n}. {m.phase}" if n is not None else f"[{m.id}] {m.phase}"
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
    line per phase, and while the shadow backfills, its progress bar on the live line.
    Returns the last migration record read."""
    rate = Rate()
    shown = ""
    while True:
        m: Migration = current(store, query)
        line = describe(m)
        if line != shown:
            progress(line)
            shown = line
        if m.phase in TERMINAL:
            return m
        if m.phase in ("shadow", "pause") and m.new_instance and m.bootstrap and \
                not any(h[0] == "steady" for h in m.history):
            try:
                plan = load_plan(m.new_plan)
                topics = sorted({n.topic for n in plan.nodes.values()
                                 if isinstance(n, Source) and n.role != "table"})
                done, total = backfill(store, m, topics, 5.0)
                progress.live("  " + bar_line(done, total, rate.add(done)), "backfill")
            except TheseusError as e:  # a broker that does not answer: say so, keep going
                progress.live(f"  backfill: {e.message}", "error")
        sleep(interval)
