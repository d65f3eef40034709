"""The backfill profile (bench/profile_backfill.py) reads the hosts' own progress lines
(migrate.run.progress_line): a change of their format must not leave it reading nothing."""

from __future__ import annotations

import pytest

from bench import profile_backfill as pb
from migrate.run import progress_line


def _progress(batch: int, rows: int, at: str, ms: dict) -> dict:
    return {"batchId": batch, "numInputRows": rows, "processedRowsPerSecond": 1.0,
            "timestamp": at, "durationMs": ms, "sources": [], "stateOperators": []}


def test_batches_are_read_from_the_hosts_progress_lines(tmp_path, monkeypatch):
    monkeypatch.setenv("THESEUS_PROGRESS_DETAIL", "1")
    log = tmp_path / "host.log"
    log.write_text("theseus: running 'q'\n" + "\n".join([
        progress_line(_progress(0, 11056, "2026-11-28T08:00:00.000Z",
                                {"latestOffset": 20, "addBatch": 3000,
                                 "triggerExecution": 3500})),
        progress_line(_progress(1, 340, "2026-11-28T08:00:04.000Z",
                                {"latestOffset": 10, "addBatch": 400,
                                 "triggerExecution": 500})),
        progress_line(_progress(2, 200, "2026-11-28T08:00:05.000Z",
                                {"addBatch": 300, "triggerExecution": 400}))]) + "\n")
    bs = pb.batches(log)
    assert [(b["batch"], b["rows"], b["ms"]) for b in bs] == \
        [(0, 11056, 3500), (1, 340, 500), (2, 200, 400)]
    t0 = bs[0]["start"] - 20.0  # the phase began 20 s before the first batch
    s = pb.summary(bs, t0, bs[-1]["start"], 1.0)
    assert s["before_first_batch_s"] == 20.0
    assert s["rows"] == 11596 and s["duration_ms_total"]["addBatch"] == 3700
    # 3.5 s then the next at 4 s: 0.5 s waited; 0.5 s then the next at 5 s: 0.5 s
    assert s["trigger_wait_s_total"] == pytest.approx(1.0)
    assert s["batches_shorter_than_trigger"] == 2


def test_the_process_trees_are_told_apart_by_their_command_lines():
    w = "/x/work"
    run = "python -m migrate.cli run "
    assert pb.role(run + f"{w}/ship_load_v1.json --state {w}/state", w) == "old"
    assert pb.role(run + f"{w}/m.plan.json --state {w}/state --instance q.g1", w) == \
        "shadow"
    assert pb.role(f"python -m migrate.cli migrate start {w}/v2.json --state {w}/s", w) == \
        "migrator"
    assert pb.role(run + f"{w}/alone.json --state {w}/alone-state", w) == "alone"
    assert pb.role(run + "/elsewhere/v1.json", w) is None


def test_the_old_querys_cpu_is_taken_out_of_the_cores_the_shadow_had():
    res = {"shadow_backfill_rows": 100_000, "alone_rows": 100_000}
    cpu = {"backfill_window_s": 50.0, "old_query": 40.0, "shadow": 50.0,
           "alone_window_s": 30.0, "alone": 40.0}
    out = pb.cpu_accounted(res, cpu)
    # 60 core-seconds left to the shadow, 60 the plan alone had: the same rate per core
    assert out["backfill_over_alone_per_core_second_left"] == 1.0
    assert out["old_query_cores_in_backfill"] == 0.8
    assert out["backfill_over_alone_per_cpu_second_used"] == 0.8
    assert pb.cpu_accounted(res, dict(cpu, alone=None)) == {}
