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
    assert json.loads(r.output)["record"]["counts"]["deleted"] == 1  # the record, as stored


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


# -- issue 32: progress read from the shadow's offsets, every phase watched ---------------

def test_the_backfill_fraction_never_goes_back_while_the_head_grows():
    """The whole is the backfill taken at step 2 (from -> to); the part read is the
    acknowledged offsets held inside it; what arrives later is counted apart."""
    from migrate.progress import backfill_counts

    rng = {"from": {"in": {"0": 0, "1": 10}}, "to": {"in": {"0": 600, "1": 410}}}
    seen, naive = [], []
    acked = {"in": {0: 0, 1: 10}}
    high = {"in": {0: 600, 1: 410}}
    for i in range(12):  # 100 a partition per batch, none in a long one; 150 arrive
        acked = {"in": {p: o + (0 if i == 4 else 100) for p, o in acked["in"].items()}}
        high = {"in": {p: o + 150 for p, o in high["in"].items()}}
        seen.append(backfill_counts(rng, acked, high))
        # what the bar showed before: read against the head now
        naive.append(sum(min(acked["in"][p], h) for p, h in high["in"].items())
                     / sum(high["in"].values()))
    fractions = [done / total for done, total, _ in seen]
    assert all(total == 1000 for _, total, _ in seen)
    assert fractions == sorted(fractions) and fractions[0] == 0.2 and fractions[-1] == 1.0
    assert naive[4] < naive[3]  # it went back
    assert seen[0][2] == 300 and seen[-1][2] == 12 * 300  # arrived since, apart
    assert seen[4][0] == seen[3][0]
    # partitions not acknowledged yet count as not read; acks beyond `to` count as whole
    assert backfill_counts(rng, {}, None) == (0, 1000, None)
    assert backfill_counts(rng, {"in": {0: 9999}}, None)[0] == 600


def test_the_backfill_range_starts_where_each_source_starts():
    from compat.check import load_plan
    from migrate.progress import backfill_range
    from tests.conftest import FIXTURES

    plan = load_plan(str(FIXTURES / "plans" / "ship_load.json"))
    topic = next(n.topic for n in plan.nodes.values() if n.step == "source")
    rng = backfill_range(plan, {topic: {0: 5, 1: 0}}, {topic: {0: 50, 1: 70}})
    assert rng == {"from": {topic: {"0": 5, "1": 0}}, "to": {topic: {"0": 50, "1": 70}}}
    doc = json.loads((FIXTURES / "plans" / "ship_load.json").read_text())
    for n in doc["nodes"]:
        if n["step"] == "source":
            n["starting_offsets"] = "latest"
    from compat.serde import from_doc

    late = backfill_range(from_doc(doc), {topic: {0: 5, 1: 0}}, {topic: {0: 50, 1: 70}})
    assert late["from"] == late["to"]  # a source from the latest offsets has no history


def history_record(store: DirectoryStore, phases: list[str], phase: str | None = None,
                   **kw) -> Migration:
    m = Migration(id="m1", query="q", new_plan="unused.json", old_instance="q",
                  new_instance="q.g1", kind="shadow", phase=phase or phases[-1],
                  history=[[p, 1000.0 + i] for i, p in enumerate(phases)], **kw)
    m.save(store)
    return m


def test_watch_prints_every_phase_even_those_shorter_than_its_poll(tmp_path):
    """Issue 32: `--watch` went from `2. shadow` to `6. cutover`: pause, cut and align had
    come and gone between two polls.  The record's history has them all."""
    store = DirectoryStore(tmp_path)
    history_record(store, ["check", "shadow"])
    looks = iter([
        # marks that are not phases are not printed; pause, cut, align between two polls
        (["check", "shadow", "caught_up", "steady", "pause", "cut", "align", "cutover"], None),
        # the runner recorded the next phase before entering it
        (["check", "shadow", "caught_up", "steady", "pause", "cut", "align", "cutover"],
         "finish"),
        (["check", "shadow", "caught_up", "steady", "pause", "cut", "align", "cutover",
          "finish", "done"], None)])

    def sleep(_):
        phases, phase = next(looks)
        history_record(store, phases, phase)

    out = io.StringIO()
    m = watch(store, "q", Progress(out, tty=False), sleep=sleep)
    assert m.phase == "done"
    assert out.getvalue().splitlines() == [
        "[m1] 1. check", "[m1] 2. shadow", "[m1] 3. pause", "[m1] 4. cut", "[m1] 5. align",
        "[m1] 6. cutover", "[m1] 7. finish", "[m1] 8. done"]


def test_watch_shows_a_resumed_phase_again_and_a_refusal(tmp_path):
    from migrate.progress import phase_log

    store = DirectoryStore(tmp_path)
    m = history_record(store, ["check", "shadow", "shadow", "pause"])
    assert phase_log(m) == ["check", "shadow", "shadow", "pause"]
    m = history_record(store, ["check"], "refused", error="no such topic 'x'")
    assert phase_log(m) == ["check", "refused"]
    out = io.StringIO()
    watch(store, "q", Progress(out, tty=False), sleep=lambda _: None)
    assert out.getvalue().splitlines() == ["[m1] 1. check",
                                           "[m1] refused (error: no such topic 'x')"]


class _FakeBroker:
    """The gated source's view of the broker: partitions and end offsets."""

    def __init__(self, ends: dict[int, int]) -> None:
        self.ends = ends

    def install(self, monkeypatch) -> None:
        import gates.source as src

        monkeypatch.setattr(src, "_kafka_partitions", lambda opts, timeout=15.0:
                            sorted(self.ends))
        monkeypatch.setattr(src, "_list_offsets", lambda opts, parts, which, timeout=15.0:
                            {p: 0 if which == "earliest" else self.ends[p] for p in parts})


def _reader(tmp_path, batches: int, max_records: int = 100000):
    from gates.source import TheseusKafkaSource

    return TheseusKafkaSource({"bootstrap": "x:1", "topic": "in", "format": "json",
                               "schema": "k STRING", "store": str(tmp_path),
                               "query": "q.g1", "node": "in",
                               "maxRecordsPerBatch": str(max_records),
                               "backfillBatches": str(batches)}).streamReader(None)


def test_a_shadow_reads_its_history_in_several_batches_then_at_full_speed(tmp_path,
                                                                          monkeypatch):
    """Issue 32: the bar sat at 0% and jumped: the shadow read its whole history in one
    batch, and its acknowledgements (what the bar reads) move once per batch."""
    from gates.source import BACKFILL_FLOOR, ReadMaxRows
    from gates.state import acked_offsets

    broker = _FakeBroker({0: 30_000, 1: 20_000})
    broker.install(monkeypatch)
    reader = _reader(tmp_path, 10)
    limit = ReadMaxRows(100000)
    at = reader.initialOffset()
    sizes, acked = [], []
    while True:
        end = reader.latestOffset(at, limit)
        acked.append(sum(acked_offsets(tmp_path, "q.g1").get("in", {}).values()))
        if end == at:
            break
        sizes.append(sum(end["in"].values()) - sum(at["in"].values()))
        at = end
        if len(sizes) <= 10:
            broker.ends[0] += 100  # input keeps arriving meanwhile
    # 50,000 at the first batch, in ten; then what arrived meanwhile, at once
    assert sizes == [5000] * 10 + [1000]
    # the acknowledgements (what the bar reads) move with every batch
    assert acked == [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    # past the head found at the first batch: the limit is maxRecordsPerBatch's alone
    broker.ends[0] += 60_000
    assert sum(reader.latestOffset(at, limit)["in"].values()) - \
        sum(at["in"].values()) == 60_000
    # a small history is not split below the floor; off (0) reads it at once
    broker.ends = {0: 3000, 1: 0}
    small = _reader(tmp_path / "s", 10)
    first = small.initialOffset()
    assert sum(small.latestOffset(first, limit)["in"].values()) == BACKFILL_FLOOR
    off = _reader(tmp_path / "o", 0)
    assert sum(off.latestOffset(off.initialOffset(), limit)["in"].values()) == 3000


def _batch_sizes(reader, limit) -> tuple[list[int], list[int]]:
    """The offsets each batch of ``reader`` reads until it is at the head, and what was
    acknowledged (what the bar reads) before each."""
    from gates.state import acked_offsets

    at = reader.initialOffset()
    sizes, acked = [], []
    while True:
        end = reader.latestOffset(at, limit)
        acked.append(sum(acked_offsets(reader.opts.store, "q.g1").get("in", {}).values()))
        if end == at:
            return sizes, acked
        sizes.append(sum(end["in"].values()) - sum(at["in"].values()))
        at = end


def test_a_shadow_backfill_is_a_few_batches_and_still_moves_the_bar(tmp_path, monkeypatch):
    """Issue 31: a micro-batch costs about 0.8 s whatever it reads
    (bench/results/profile_backfill.md), so a shadow that read 120,000 records of history in
    twelve batches, against the plan alone's two, was slower for the batches alone.  The
    shadow host's setting reads them in four; a history of 12,000 (the integration test of
    the bar) still moves the bar three times before it is full (issue 32)."""
    from gates.source import ReadMaxRows
    from migrate.run import BACKFILL_BATCHES

    limit = ReadMaxRows(100000)
    broker = _FakeBroker({0: 40_000, 1: 40_000, 2: 40_000})
    broker.install(monkeypatch)
    shadow, _ = _batch_sizes(_reader(tmp_path / "big", BACKFILL_BATCHES), limit)
    alone, _ = _batch_sizes(_reader(tmp_path / "alone", 0), limit)
    assert sum(shadow) == sum(alone) == 120_000
    assert len(alone) == 2 and len(shadow) <= 4, (shadow, alone)
    broker.ends = {0: 4000, 1: 4000, 2: 4000}
    sizes, acked = _batch_sizes(_reader(tmp_path / "small", BACKFILL_BATCHES), limit)
    assert sum(sizes) == 12_000
    assert len({a for a in acked if 0 < a < 12_000}) >= 3, acked
