"""Issue 11 with a real broker and a real Spark: errors a user can cause at run time end in
one line and an exit code; the in-place path prints and resumes its own numbered steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from compat.errors import ControlError
from tests.conftest import FIXTURES

from .conftest import ROOT, spark_env
from .test_migration import drain_and_stop, input_records, start_old, theseus, wait_caught_up

pytestmark = [pytest.mark.integration]


def test_a_refused_control_event_names_topic_and_partition(kafka):
    """The broker refuses the control record (larger than the topic allows)."""
    from gates.control import write_control_events

    topic = kafka.topic(prefix="tiny", partitions=2, config={"max.message.bytes": "64"})
    with pytest.raises(ControlError) as e:
        write_control_events(kafka.bootstrap, [topic], "mig-refused", deadline=30)
    assert e.value.topic == topic and e.value.partition in (0, 1)
    assert "not delivered" in e.value.message and e.value.found


def test_a_failed_control_event_write_in_migrate_ends_in_one_line(kafka, tmp_path):
    """issue 11: this printed a traceback.  Step 4 of a migration on a real broker that
    refuses the control records: one error (exit 5) naming step, topic and partition, and
    the migration stays resumable at its recorded phase.  (Run as the migrator runs step 4:
    a ``resume`` recorded in step 4 before its cut was armed now pauses again first,
    :mod:`migrate.phases.catch_up`.)"""
    from compat.check import load_plan
    from compat.errors import MigrationError
    from compat.serde import dumps
    from migrate import migration, runner
    from migrate.context import Context
    from migrate.record import Migration, resume_hint
    from migrate.store import DirectoryStore

    topic = kafka.topic(prefix="tiny", partitions=2, config={"max.message.bytes": "64"})
    store = DirectoryStore(tmp_path / "state")
    plan = FIXTURES / "plans" / "ship_load.json"
    store.put_plan("ship_load", dumps(load_plan(str(plan))))
    store.set_status("ship_load", status="running", generation=0)
    m = Migration(id="m1", query="ship_load", new_plan=str(plan), old_instance="ship_load",
                  new_instance="ship_load.g1", generation=1, kind="shadow", phase="cut",
                  bootstrap=kafka.bootstrap, high={topic: {"0": 0, "1": 0}})
    m.save(store)
    with pytest.raises(MigrationError) as e:
        runner.step(m, Context(store, lambda s: None, 60, hint=resume_hint("ship_load")))
    line = e.value.render()
    assert e.value.exit_code == 5 and "\n" not in line, line
    assert "step 4 (cut)" in line and f"topic '{topic}', partition" in line, line
    assert "not delivered" in line and "migrate resume ship_load" in line, line
    m = migration.current(store, "ship_load")
    assert m.phase == "cut" and not m.cut


@pytest.mark.own_jvm
def test_a_source_topic_with_fewer_partitions_than_the_plan_is_one_line_exit_4(kafka,
                                                                             tmp_path):
    """Raised inside Spark's Python data source runner: the host reports the Theseus error
    (topic, expected, found), not Spark's wrapper and its JVM stack trace."""
    src = kafka.topic(prefix="parts-in", partitions=1)
    out = kafka.topic(prefix="parts-out", partitions=1)
    kafka.produce(src, [{"id": i} for i in range(5)])
    doc = {"format": "theseus.plan/1", "query": "parts", "config": {"state_partitions": 2},
           "nodes": [{"id": "events", "step": "source", "version": 1, "topic": src,
                      "partitions": 3, "format": "json", "role": "stream",
                      "schema": [{"name": "id", "type": "bigint"}]},
                     {"id": "out", "step": "sink", "version": 1, "inputs": ["events"],
                      "topic": out, "format": "json", "key_columns": [], "mode": "append",
                      "delivery": "at_least_once"}]}
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(doc))
    r = subprocess.run([sys.executable, "-m", "migrate.cli", "run", str(plan), "--bootstrap",
                        kafka.bootstrap, "--state", str(tmp_path / "state"),
                        "--available-now"], cwd=ROOT, capture_output=True, text=True,
                       env=spark_env(), timeout=300)
    assert r.returncode == 4, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "\tat org.apache" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"theseus: error: {plan}: the query failed: topic '{src}'"), last
    assert "(expected 3 partitions, found 1)" in last
    status = json.loads((tmp_path / "state" / "queries" / "parts" / "status.json").read_text())
    assert status["status"] == "failed" and "SourceError" in status["error"]


@pytest.mark.own_jvm
def test_an_in_place_migration_killed_in_its_restart_resumes_on_its_own_steps(kafka,
                                                                            tmp_path):
    t = start_old(kafka, tmp_path, "inp")
    wait_caught_up(kafka, t.state, t.store.live_instance(t.query), t.src)  # before the cut
    env = dict(os.environ, THESEUS_FAULT="after:in_place")
    r = theseus("migrate", "start", str(t.new_p), "--bootstrap", kafka.bootstrap, "--state",
                str(t.state), "--strategy", "in-place", "--timeout", "300", env=env,
                timeout=400)
    assert r.returncode == -9, r.stdout + r.stderr
    assert "1. check" in r.stdout and "2. in_place" in r.stdout
    assert "cutover" not in r.stdout
    r = theseus("migrate", "resume", t.query, "--state", str(t.state), "--timeout", "300",
                timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr
    steps = [ln.split("] ", 1)[1] for ln in r.stdout.splitlines() if ln.startswith("[m")]
    assert steps == ["2. in_place", "3. finish", "4. done"], r.stdout
    from migrate import migration

    m = migration.current(t.store, t.query)
    assert m.kind == "in_place" and m.phase == "done"
    assert t.store.live_instance(t.query) == t.query
    # the restarted host is another process; the one started by the test has stopped
    t.old.wait(120)
    live = drain_and_stop(kafka, t)
    assert live == t.query
    inputs = input_records(kafka, t.src)
    rows = [r.json() for r in kafka.read_all(t.out)]
    ids = Counter(r["id"] for r in rows)
    assert ids == Counter(r.json()["id"] for r in inputs)  # each input once, none lost
    assert {r["tag"] for r in rows} == {"old", "new"}
