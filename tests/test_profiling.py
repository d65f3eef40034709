"""The profiling switch of the changelog operators (``migrate.build.profiling``) and the
readers of the profile (``bench/eventlog.py``, ``bench/pyprof.py``), without Spark."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bench.eventlog import per_batch, read
from bench.pyprof import breakdown
from migrate.build import changelog
from migrate.build.profiling import ENV, labels, profiled, summary


def _work(rows: Any) -> int:
    return sum(rows)


class _Base:
    def init(self, handle: Any) -> None:
        self.handle = handle

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:  # noqa: N802,N803
        yield _work(rows)

    def close(self) -> None:
        self.closed = True


def test_a_profiled_task_leaves_one_profile_that_counts_its_calls(tmp_path):
    cls = profiled(_Base, str(tmp_path / "p"), "agg_abc")
    for _task in range(2):
        proc = cls()
        proc.init("handle")
        for k in range(7):
            assert list(proc.handleInputRows(k, [1, 2], None)) == [3]
        proc.close()
        assert proc.closed and proc.handle == "handle"  # the processor's own init and close ran
    assert len(list((tmp_path / "p").glob("agg_abc.*.prof"))) == 2
    assert labels(tmp_path / "p") == ["agg_abc"]
    stats = summary(tmp_path / "p", "agg_abc")
    calls = {k[2]: v[1] for k, v in stats.stats.items()}  # type: ignore[attr-defined]
    assert calls["_work"] == 14  # both tasks' calls, added up
    assert summary(tmp_path / "p", "norm_x") is None


def test_a_close_without_init_writes_nothing(tmp_path):
    proc = profiled(_Base, str(tmp_path), "x")()
    proc.close()
    assert not list(tmp_path.glob("*.prof"))


class _FakeGrouped:
    def __init__(self, seen: list) -> None:
        self.seen = seen

    def transformWithStateInPandas(self, processor: Any, *args: Any) -> str:  # noqa: N802
        self.seen.append(processor)
        return "out"

    def transformWithState(self, processor: Any, *args: Any) -> str:  # noqa: N802
        self.seen.append(processor)
        return "out"


class _FakeDf:
    columns = ["_theseus_key", "_theseus_row"]

    def __init__(self) -> None:
        self.seen: list = []

    def groupBy(self, *keys: str) -> _FakeGrouped:  # noqa: N802
        return _FakeGrouped(self.seen)


@pytest.mark.parametrize("rows,name", [(False, "PandasProcessor"), (True, "RowProcessor")])
def test_the_switch_is_read_when_the_operator_is_built(monkeypatch, tmp_path, rows, name):
    df = _FakeDf()
    monkeypatch.delenv(ENV, raising=False)
    fields = ("_theseus_row", "_theseus_key")
    changelog._stateful(df, lambda k, c, s: [], fields, "st string", "agg_1", rows)
    plain = type(df.seen[-1])
    assert plain.__name__ == name  # off: the processor itself, nothing wrapped
    monkeypatch.setenv(ENV, str(tmp_path))
    changelog._stateful(df, lambda k, c, s: [], fields, "st string", "agg_1", rows)
    on = type(df.seen[-1])
    assert on.__name__ == f"Profiled{name}" and on.__mro__[1].__name__ == name


def _event_log(path) -> None:
    plan = {"nodeName": "TransformWithStateInPandas", "metrics": [
        {"name": "number of output rows", "accumulatorId": 7, "metricType": "sum"}],
        "children": [{"nodeName": "Exchange", "metrics": [
            {"name": "shuffle records written", "accumulatorId": 8, "metricType": "sum"}]}]}
    events = [
        {"Event": "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionStart",
         "executionId": 0, "sparkPlanInfo": plan},
    ]
    jobs = [(0, {"sql.streaming.queryId": "q1", "streaming.sql.batchId": "3"}, [0, 1]),
            (1, {"sql.streaming.queryId": "q1", "streaming.sql.batchId": "3"}, [2]),
            (2, {"sql.streaming.queryId": "q1", "streaming.sql.batchId": "4"}, [3]),
            (3, {}, [4])]
    for jid, props, stages in jobs:
        events.append({"Event": "SparkListenerJobStart", "Job ID": jid,
                       "Submission Time": 1000 + 100 * jid, "Stage IDs": stages,
                       "Properties": props})
        for s in stages:
            events.append({"Event": "SparkListenerTaskEnd", "Stage ID": s,
                           "Task Info": {"Accumulables": [
                               {"ID": 7, "Update": 5, "Value": 99},
                               {"ID": 8, "Update": "2", "Value": 99},
                               {"ID": 1234, "Update": 1}]},
                           "Task Metrics": {"Executor Run Time": 10 * (s + 1),
                                            "Executor CPU Time": 3_000_000}})
        events.append({"Event": "SparkListenerJobEnd", "Job ID": jid,
                       "Completion Time": 1050 + 100 * jid})
    path.write_text("".join(json.dumps(e) + "\n" for e in events))


def test_the_event_log_adds_up_jobs_tasks_and_operator_metrics_per_batch(tmp_path):
    _event_log(tmp_path / "app")
    jobs = read(tmp_path / "app")
    assert [(j.id, j.query, j.batch, j.tasks) for j in jobs] == [
        (0, "q1", 3, 2), (1, "q1", 3, 1), (2, "q1", 4, 1), (3, None, None, 1)]
    batches = {(b.query, b.batch): b for b in per_batch(jobs)}
    b3 = batches[("q1", 3)]
    assert (b3.jobs, b3.stages, b3.tasks) == (2, 3, 3)
    assert b3.wall_ms == 1150 - 1000  # first job's submission to the last one's end
    assert b3.metrics["run_ms"] == 10 + 20 + 30
    assert b3.metrics["cpu_ms"] == 9.0  # nanoseconds in the log
    # the updates of each task, named by operator (an unknown accumulator is left out)
    assert dict(b3.sql) == {"TransformWithStateInPandas: number of output rows": 15,
                            "Exchange: shuffle records written": 6}
    assert batches[(None, None)].jobs == 1


def test_the_parts_of_a_python_profile_add_up_to_the_profiled_time(tmp_path):
    cls = profiled(_Base, str(tmp_path), "join_1")
    proc = cls()
    proc.init(None)
    for k in range(50):
        list(proc.handleInputRows(k, [json.loads(json.dumps(list(range(20))))[0]], None))
    proc.close()
    out = breakdown(summary(tmp_path, "join_1"))
    assert abs(sum(out["parts_s"].values()) - out["profiled_s"]) < 0.01
    assert out["markers"]["json.loads"]["calls"] == 50
