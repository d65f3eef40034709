"""Issue 13: what the migrator shows. One live line rewritten in place on a terminal (the
backfill's progress bar with rate and ETA, then the phases on lines of their own), plain
lines at most every few seconds otherwise, and ``migrate status --watch``."""

from __future__ import annotations

import io
import json

from click.testing import CliRunner

from migrate.cli import main
from migrate.progress import Progress, Rate, bar_line, fmt_seconds, watch
from migrate.record import Migration
from migrate.store import DirectoryStore


def test_bar_shows_fraction_rate_and_eta():
    line = bar_line(250, 1000, 50.0, width=20)
    assert line.startswith("backfill [#####...............]  25%")
    assert "250/1,000 records" in line and "50/s" in line and "ETA 0:15" in line
    assert "ETA --" in bar_line(0, 1000, 0.0)
    assert "at the head" in bar_line(1000, 1000, 10.0)
    assert fmt_seconds(3725) == "1:02:05" and fmt_seconds(75) == "1:15"


def test_rate_over_a_sliding_window():
    r = Rate(window=10)
    assert r.add(0, at=0.0) == 0.0
    assert r.add(100, at=1.0) == 100.0
    r.add(200, at=2.0)
    assert r.add(2000, at=20.0) == (2000 - 200) / 18.0  # samples older than 10 s dropped


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_rewrites_one_live_line_and_phases_stay():
    out = Tty()
    p = Progress(out)
    for i in range(50):
        p.live(f"backfill {i}")
    p("[m1] 3. pause")
    p.live("near the head")
    p.close()
    text = out.getvalue()
    assert text.count("\n") == 2  # the phase line, and the live line's end at close
    assert text.count("\r\x1b[2K") == 50 + 1 + 1  # each update, the clear before the phase
    lines = text.split("\n")
    assert lines[0].endswith("\r\x1b[2K[m1] 3. pause")
    assert lines[1].endswith("near the head")


def test_plain_output_prints_live_lines_rarely():
    now = [0.0]
    out = io.StringIO()
    p = Progress(out, tty=False, every=10, clock=lambda: now[0])
    for i in range(67):  # 67 polls, half a second apart: what the demo printed before
        p.live(f"backfill {i}", "backfill")
        now[0] += 0.5
    p.live("near the head", "steady")  # a new kind of line is shown at once
    lines = out.getvalue().splitlines()
    assert lines == ["backfill 0", "backfill 20", "backfill 40", "backfill 60",
                     "near the head"]
    assert "\r" not in out.getvalue()


def record(store: DirectoryStore, phase: str, **kw) -> Migration:
    m = Migration(id="m1", query="q", new_plan="unused.json", old_instance="q",
                  new_instance="q.g1", kind="shadow", phase=phase, **kw)
    m.save(store)
    return m


def test_watch_follows_the_phases_until_the_migration_ends(tmp_path):
    store = DirectoryStore(tmp_path)
    phases = iter(["align", "cutover", "finish", "done"])
    record(store, "cut")

    def sleep(_):  # another process moves the migration on
        ph = next(phases)
        kw = {"reconciling": True}
        if ph in ("finish", "done"):
            kw["counts"] = {"corrected": 3, "added": 1, "deleted": 2, "matched": 7}
        record(store, ph, **kw)

    out = io.StringIO()
    m = watch(store, "q", Progress(out, tty=False), sleep=sleep)
    assert m.phase == "done"
    assert out.getvalue().splitlines() == [
        "[m1] 4. cut", "[m1] 5. align", "[m1] 6. cutover (reconciling at the hand-over)",
        "[m1] 7. finish (reconciled: 3 corrected, 1 added, 2 deleted, 7 already right)",
        "[m1] 8. done (reconciled: 3 corrected, 1 added, 2 deleted, 7 already right)"]


def test_status_watch_of_a_finished_migration_returns_at_once(tmp_path):
    store = DirectoryStore(tmp_path)
    record(store, "done", reconciling=True,
           counts={"corrected": 29, "added": 0, "deleted": 1, "matched": 0})
    r = CliRunner().invoke(main, ["migrate", "status", "q", "--state", str(tmp_path),
                                  "--watch"])
    assert r.exit_code == 0, r.output
    assert "[m1] 8. done" in r.output
    assert "reconciliation: 29 corrected, 0 added, 1 deleted, 0 already right" in r.output
    r = CliRunner().invoke(main, ["migrate", "status", "q", "--state", str(tmp_path),
                                  "--format", "json"])
    assert json.loads(r.output)["counts"]["deleted"] == 1


def test_start_hands_the_live_line_to_the_migrator_and_records_the_old_instance(
        tmp_path, monkeypatch):
    from compat.check import load_plan
    from compat.serde import dumps
    from migrate import migration, runner
    from tests.conftest import FIXTURES

    plan = str(FIXTURES / "plans" / "ship_load.json")
    store = DirectoryStore(tmp_path)
    store.put_plan("ship_load", dumps(load_plan(plan)))
    store.set_status("ship_load", status="running", generation=0)
    seen = {}

    def run(m, ctx):
        seen.update(live=ctx.live, old=m.old_instance, reconcile=m.reconcile)
        return m

    monkeypatch.setattr(runner, "run", run)
    shown: list = []
    migration.start(store, "ship_load", plan, bootstrap="unused:9092", reconcile="on",
                    live=lambda text, kind: shown.append(text))
    seen["live"]("a live line", "kind")
    assert shown == ["a live line"]
    assert seen["old"] == "ship_load" and seen["reconcile"] == "on"
