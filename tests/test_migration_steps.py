"""Issue 11: the migrator's steps without services: both paths' phases in one numbered
table (an in-place restart no longer prints "6. cutover"), resume of the in-place path, and
a cut C behind the high watermarks H refused."""

from __future__ import annotations

import os

import pytest

from compat.check import load_plan
from compat.errors import InvalidRequest, MigrationError
from compat.serde import dumps
from migrate import migration, runner, sides
from migrate.context import Context
from migrate.phases import check as check_phase
from migrate.phases.cut import check_cut
from migrate.protocol import PHASES, TERMINAL, next_phase, path_of, resume_phase, step_number
from migrate.record import Migration, new_migration
from migrate.runner import HANDLERS
from migrate.services.processes import Processes
from migrate.store import DirectoryStore
from tests.conftest import FIXTURES

SHIP_LOAD = str(FIXTURES / "plans" / "ship_load.json")


def test_every_phase_of_the_table_that_acts_has_one_handler():
    assert set(HANDLERS) == {p for p, row in PHASES.items() if not row.terminal}
    assert "in_place" in PHASES and TERMINAL == ("done", "aborted", "refused", "previewed")


def test_each_path_is_numbered_one_to_n_in_order():
    for kind, column in (("shadow", 0), ("in_place", 1)):
        numbers = [n[column] for n in PHASES.values() if n[column] is not None]
        assert numbers == list(range(1, len(numbers) + 1)), kind
    assert [p for p, n in PHASES.items() if n[1]] == ["check", "in_place", "finish", "done"]
    assert step_number("shadow", "cutover") == 6 and step_number("in_place", "cutover") is None
    assert step_number("", "check") == 1  # undecided yet
    assert step_number("shadow", "aborted") is None


def test_the_table_says_the_order_of_each_path():
    assert path_of("shadow") == ("check", "shadow", "pause", "cut", "align", "propagate",
                                 "cutover", "finish", "done")
    assert path_of("in_place") == ("check", "in_place", "finish", "done")


def test_propagate_follows_the_alignment_of_a_cascades_upstream_only():
    m = Migration(id="m1", query="q", new_plan=SHIP_LOAD, old_instance="q", kind="shadow",
                  phase="align")
    assert next_phase(m) == "cutover"
    m.feeds = ["m2"]
    assert next_phase(m) == "propagate"
    m.phase = "propagate"
    assert next_phase(m) == "cutover"
    m.kind, m.phase = "in_place", "check"
    assert next_phase(m) == "in_place"


def test_a_phase_off_its_path_is_one_clear_error():
    m = Migration(id="m1", query="q", new_plan=SHIP_LOAD, old_instance="q", kind="in_place",
                  phase="pause")
    with pytest.raises(MigrationError, match="no phase follows 'pause' on the in_place path"):
        next_phase(m)


def test_a_resume_re_enters_at_the_recorded_phase():
    assert resume_phase("shadow", "cutover") == "cutover"
    assert resume_phase("in_place", "cutover") == "in_place"  # recorded by an older theseus
    assert resume_phase("shadow", "pause") == "pause"


def test_a_step_records_its_phase_before_it_acts_and_the_next_one_once_done(tmp_path,
                                                                           monkeypatch):
    store = DirectoryStore(tmp_path)
    m = Migration(id="m1", query="q", new_plan=SHIP_LOAD, old_instance="q", kind="shadow",
                  phase="align", feeds=["m2"])
    m.save(store)
    seen: list[str] = []
    monkeypatch.setitem(HANDLERS, "align",
                        lambda m, ctx: seen.append(migration.current(store, "q").phase))
    lines: list[str] = []
    runner.step(m, Context(store, lines.append, 60))
    assert seen == ["align"] and lines == ["[m1] 5. align"]
    again = migration.current(store, "q")
    assert again.phase == "propagate" and [h[0] for h in again.history] == ["align"]
    # the last step records the end as a phase of its own
    monkeypatch.setitem(HANDLERS, "finish", lambda m, ctx: None)
    m.phase = "finish"
    runner.step(m, Context(store, lines.append, 60))
    assert lines[1:] == ["[m1] 7. finish", "[m1] 8. done"]
    assert migration.current(store, "q").phase == "done"


class FakeHost:
    """The query host as the in-place step sees it through the store: ``spawn`` restarts
    the instance on the new plan (recording it as ``theseus run`` does)."""

    def __init__(self, store: DirectoryStore, instance: str) -> None:
        self.store, self.instance, self.spawned = store, instance, []

    def install(self, monkeypatch) -> None:
        store = self.store

        def spawn(hosts, m, plan_path, instance, generation, gated):
            self.spawned.append((plan_path, instance, generation, gated))
            store.put_plan(instance, dumps(load_plan(plan_path)))
            store.set_status(instance, status="running", pid=os.getpid())
            return os.getpid()

        def stopped(hosts, instance):
            return store.stop_requested(instance)  # the host obeys at once

        monkeypatch.setattr(Processes, "spawn", spawn)
        monkeypatch.setattr(Processes, "stopped", stopped)


def in_place_store(tmp_path, phase: str, kind: str = "in_place"):
    store = DirectoryStore(tmp_path)
    store.put_plan("ship_load", "{}")  # the old plan (not read by these steps)
    store.set_status("ship_load", status="running", pid=os.getpid(), generation=3)
    m = Migration(id="m1", query="ship_load", new_plan=SHIP_LOAD, old_instance="ship_load",
                  new_instance="ship_load.g4", generation=4, kind=kind, phase=phase,
                  verdict="in_place")
    m.save(store)
    return store, m


def test_an_in_place_restart_prints_its_own_steps(tmp_path, monkeypatch):
    store, m = in_place_store(tmp_path, "in_place")
    host = FakeHost(store, "ship_load")
    host.install(monkeypatch)
    lines: list[str] = []
    done = runner.run(m, Context(store, lines.append, 60))
    assert lines == ["[m1] 2. in_place", "[m1] 3. finish", "[m1] 4. done"]
    assert done.phase == "done"
    assert host.spawned == [(SHIP_LOAD, "ship_load", 3, False)]  # same checkpoint
    assert store.live_instance("ship_load") == "ship_load"  # no new instance in place
    assert [h[0] for h in done.history] == ["in_place", "finish", "done"]


def test_resumed_after_the_restart_it_does_not_restart_again(tmp_path, monkeypatch):
    store, m = in_place_store(tmp_path, "in_place")
    store.put_plan("ship_load", dumps(load_plan(SHIP_LOAD)))  # already on the new plan
    host = FakeHost(store, "ship_load")
    host.install(monkeypatch)
    lines: list[str] = []
    migration.resume(store, "ship_load", echo=lines.append, timeout=60)
    assert host.spawned == [] and not store.stop_requested("ship_load")
    assert lines[0] == "[m1] 2. in_place"


def test_a_record_from_before_the_in_place_phase_resumes_on_its_path(tmp_path, monkeypatch):
    """Records written when the in-place restart was recorded as phase "cutover"."""
    store, _ = in_place_store(tmp_path, "cutover")
    FakeHost(store, "ship_load").install(monkeypatch)
    lines: list[str] = []
    migration.resume(store, "ship_load", echo=lines.append, timeout=60)
    assert lines == ["[m1] 2. in_place", "[m1] 3. finish", "[m1] 4. done"]


# ------------------------------------------------------------------------- C >= H

def test_a_cut_at_or_beyond_the_high_watermarks_passes():
    check_cut({"t": {0: 10, 1: 5}}, {"t": {0: 10, 1: 9}})
    check_cut({"t": {0: 10}}, {"t": {0: 10}, "u": {0: 1}})


def test_a_cut_behind_the_high_watermarks_names_topic_partition_and_both_offsets():
    with pytest.raises(MigrationError) as e:
        check_cut({"t": {0: 10, 1: 5}}, {"t": {0: 11, 1: 4}})
    text = str(e.value)
    assert "topic 't' partition 1" in text
    assert "offset 5" in text and "offset 4" in text


def test_a_cut_missing_a_partition_is_refused():
    with pytest.raises(MigrationError) as e:
        check_cut({"t": {0: 10, 1: 5}}, {"t": {0: 11}})
    assert "topic 't' partition 1" in str(e.value)


def test_step_cut_refuses_control_events_behind_h_and_records_no_cut(tmp_path, monkeypatch):
    """A topic deleted and created again between the pause and the cut: the control events
    land behind H.  The step refuses before arming any gate."""
    import gates.control

    store = DirectoryStore(tmp_path)
    m = Migration(id="m1", query="q", new_plan=SHIP_LOAD, old_instance="q",
                  new_instance="q.g1", kind="shadow", phase="cut", bootstrap="b:9092",
                  high={"packages": {"0": 120, "1": 80}})
    m.save(store)
    monkeypatch.setattr(gates.control, "write_control_events",
                        lambda *a, **k: {"packages": {0: 3, 1: 2}})
    with pytest.raises(MigrationError) as e:
        runner.step(m, Context(store, lambda s: None, 60))
    assert "topic 'packages' partition 0" in str(e.value)
    assert "offset 120" in str(e.value) and "offset 3" in str(e.value)
    again = migration.current(store, "q")
    assert again.phase == "cut" and again.cut == {}
    assert not (store.root / "gates").exists()  # no gate was armed


# ------------------------------------------------------------------------- failed queries

@pytest.mark.parametrize("which", ["old", "shadow"])
def test_a_failed_query_ends_the_wait_with_its_error(tmp_path, which):
    """A query that failed (the old one, or the shadow) never reaches H: the migrator says
    so at once, with the Theseus error line of Spark's failure, instead of at the
    deadline."""
    from tests.test_runtime_errors import SPARK_FAILURE

    store = DirectoryStore(tmp_path)
    m = Migration(id="m1", query="q", new_plan=SHIP_LOAD, old_instance="q",
                  new_instance="q.g1", kind="shadow", phase="pause")
    store.set_status("q" if which == "old" else "q.g1", status="failed",
                     error=SPARK_FAILURE)
    with pytest.raises(MigrationError) as e:
        Context(store, lambda s: None, 600).wait(m, "'q' to reach H", lambda: False)
    text = str(e.value)
    assert f"the {which} query" in text
    assert "the topic has fewer partitions than the plan says" in text
    assert "SQLSTATE" not in text and "theseus migrate abort q" in text


def select_doc(threshold: int, table: bool) -> dict:
    """A filter over a table read as a changelog (or over a stream) into a keyed sink."""
    src = {"id": "users", "step": "source", "version": 2 if table else 1, "topic": "users",
           "partitions": 1, "format": "json", "role": "table" if table else "stream",
           "schema": [{"name": "user_id", "type": "string"},
                      {"name": "score", "type": "bigint"}]}
    if table:
        src["key_columns"] = ["user_id"]
    return {"format": "theseus.plan/1", "query": "q", "nodes": [src, {
        "id": "keep", "step": "filter", "version": 1, "inputs": ["users"],
        "predicate": f"score > {threshold}"}, {
        "id": "out", "step": "sink", "version": 1, "inputs": ["keep"], "topic": "out",
        "format": "json", "key_columns": ["user_id"],
        "mode": "update" if table else "append", "delivery": "exactly_once"}]}


@pytest.mark.parametrize("table,strategy,kind", [
    (True, "auto", "shadow"),  # over a changelog: a fresh state and the reconciliation
    (True, "in-place", "refused"),  # asked for: refused, never restarted into stale rows
    (False, "auto", "in_place"),  # over a stream the passive change restarts in place
])
def test_an_in_place_upgrade_of_a_table_query_goes_through_a_shadow(tmp_path, monkeypatch,
                                                                    table, strategy, kind):
    """A stricter filter over a changelog is in_place for the checker (ksqlDB's
    TableFilter), but restarted on the checkpoint it would drop the retraction of a row the
    old filter wrote: the old row would stay in the output for good."""
    import json

    from compat.serde import from_doc

    store = DirectoryStore(tmp_path / "state")
    store.put_plan("q", dumps(from_doc(select_doc(20, table))))
    store.set_status("q", status="running", pid=os.getpid())
    p = tmp_path / "new.json"
    p.write_text(json.dumps(select_doc(50, table)))
    m = Migration(id="m1", query="q", new_plan=str(p), old_instance="q",
                  new_instance="q.g1", strategy=strategy, reconcile="auto",
                  bootstrap="unused:9092")
    for name in ("require_access", "require_history"):  # Kafka: not here
        monkeypatch.setattr(check_phase, name, lambda *a: None)
    monkeypatch.setattr(check_phase, "preflight", lambda *a: {})
    monkeypatch.setattr(check_phase, "checkpoint_agrees", lambda *a: True)
    lines: list[str] = []
    if kind == "refused":
        with pytest.raises(InvalidRequest) as e:
            check_phase.check(m, Context(store, lines.append, 60))
        assert "--strategy in-place" in str(e.value) and "changelogs" in str(e.value)
        assert m.phase == "refused" and "retract rows" in m.error
        return
    check_phase.check(m, Context(store, lines.append, 60))
    assert (m.verdict, m.kind) == ("in_place", kind)
    assert m.reconciling is (kind == "shadow")
    assert any("reads tables as changelogs" in ln for ln in lines) is (kind == "shadow")


def test_a_sql_plan_is_recorded_as_its_compiled_json_plan(tmp_path):
    """`theseus migrate start new.sql`: the migration records the plan it runs as JSON (it
    had copied the SQL text into <id>.plan.json, which every later step failed to read)."""
    sql = FIXTURES / "history" / "filter_project" / "v1" / "query.sql"
    store = DirectoryStore(tmp_path)
    plan = load_plan(str(sql))
    store.put_plan(plan.query, dumps(plan))
    store.set_status(plan.query, status="running", generation=0)
    m = new_migration(store, plan.query, str(sql), bootstrap="127.0.0.1:1")
    assert dumps(load_plan(m.new_plan)) == dumps(plan)
    assert sides.plans(store, m)[1].query == plan.query


def test_a_shadow_process_gone_without_a_word_ends_the_wait_with_its_last_line(tmp_path):
    """A shadow whose `theseus run` exited before its query started (here: it could not ask
    the brokers for its permissions while one was down) records no failure: the migrator
    notices that the process it started is gone and says what its log said, instead of
    waiting for the deadline.  A dead old query is left to its host (it may restart it)."""
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    store = DirectoryStore(tmp_path)
    m = Migration(id="m1", query="q", new_plan=SHIP_LOAD, old_instance="q",
                  new_instance="q.g1", kind="shadow", phase="pause")
    store.set_status("q", status="running", pid=dead.pid)
    from compat.errors import DeadlineExceeded

    with pytest.raises(DeadlineExceeded):  # the old query's death alone ends nothing
        Context(store, lambda s: None, 1).wait(m, "'q' to reach H", lambda: False)
    store.log_path("q.g1").write_text(
        "%4|1795508457.091|FAIL|rdkafka#producer-4| broker down\n"
        "theseus: error: the time budget of 60 s ran out waiting for the topics' "
        "authorized operations\n%3|1795508497.402|FAIL|rdkafka#admin-1| refused\n")
    store.set_status("q.g1", status="starting", pid=dead.pid)
    with pytest.raises(MigrationError) as e:
        Context(store, lambda s: None, 600).wait(m, "'q.g1' to reach H", lambda: False)
    text = str(e.value)
    assert "the shadow query 'q.g1' exited before it ran" in text
    assert "ran out waiting for the topics' authorized operations" in text
    assert "rdkafka" not in text and "theseus migrate abort q" in text
    # alive: no error
    store.set_status("q.g1", status="running", pid=os.getpid())
    Context(store, lambda s: None, 600).processes.check_alive(m)
