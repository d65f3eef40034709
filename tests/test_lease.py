"""Issue 32, items 1 and 2 without services: a migration's lease (taken by compare-and-set,
refused naming a live holder, taken over once stale, preempted by abort), the fencing of
every write by it, what a stale lease lifts in the gated source, and how a run catches up."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time

import pytest

from compat.errors import DeadlineExceeded, Refused
from gates.files import atomic_write
from gates.lease import lease_path, lifted, read_lease, this_host, why_stale
from gates.state import GateState, read_gate, write_ack, write_gate
from migrate.lease import Lapsed, Lease, LeaseLost
from migrate.store import DirectoryStore


def _age(store, query, seconds, host=None):
    """Make the lease of ``query`` look as if its holder last renewed ``seconds`` ago
    (on ``host``, when given)."""
    p = lease_path(store.root, query)
    doc = json.loads(p.read_text())
    doc["heartbeat"] -= seconds
    if host:
        doc["holder"]["host"] = host
    p.write_text(json.dumps(doc))


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


# -- taking -----------------------------------------------------------------------------------

def test_a_live_holder_is_named_and_nothing_is_advised_that_would_run_beside_it(tmp_path):
    store = DirectoryStore(tmp_path)
    first = Lease.take(store, ["q"], "m1", what="theseus migrate start", ttl=15,
                       command="theseus migrate start v3.sql")
    with pytest.raises(Refused) as e:
        Lease.take(store, ["q"], "m1", what="theseus migrate resume", ttl=15)
    msg = e.value.render()
    assert e.value.exit_code == 6
    assert f"pid {os.getpid()} on {this_host()}" in msg
    assert "theseus migrate start v3.sql" in msg and "migration m1 of 'q'" in msg
    assert "last heartbeat" in msg and "expires in" in msg
    assert "migrate resume q" not in msg and "migrate abort q" in msg
    assert read_lease(tmp_path, "q")["epoch"] == 1  # the refusal wrote nothing
    first.release()


def test_a_stale_lease_is_taken_over_with_the_next_epoch(tmp_path):
    store = DirectoryStore(tmp_path)
    first = Lease.take(store, ["q"], "m1", what="start", ttl=2)
    _age(store, "q", 3, host="elsewhere")  # a holder on another host, silent for 3 s > 2 s
    assert "no heartbeat for 3" in why_stale(read_lease(tmp_path, "q"))
    second = Lease.take(store, ["q"], "m1", what="resume", ttl=2)
    assert read_lease(tmp_path, "q")["epoch"] == 2 == second.epochs["q"]
    with pytest.raises(LeaseLost, match=r"was taken over by pid \d+ on .*epoch 2\); this "
                                        "process stops"):
        first.renew(force=True)
    second.release()


def test_a_dead_holder_on_this_host_frees_the_lease_at_once(tmp_path):
    store = DirectoryStore(tmp_path)
    first = Lease.take(store, ["q"], "m1", what="start", ttl=600)
    p = lease_path(tmp_path, "q")
    doc = json.loads(p.read_text())
    doc["holder"]["pid"] = _dead_pid()
    p.write_text(json.dumps(doc))
    assert "is gone" in why_stale(read_lease(tmp_path, "q"))
    Lease.take(store, ["q"], "m1", what="resume", ttl=600).release()
    first._fds.clear()


def test_a_released_lease_is_taken_at_once_and_its_epoch_goes_on(tmp_path):
    store = DirectoryStore(tmp_path)
    Lease.take(store, ["q"], "m1", what="start", ttl=600).release()
    assert read_lease(tmp_path, "q")["released"] is True
    nxt = Lease.take(store, ["q"], "m2", what="start", ttl=600)
    assert nxt.epochs == {"q": 2} and read_lease(tmp_path, "q")["migration"] == "m2"
    nxt.release()


def test_abort_preempts_a_live_holder_whose_next_write_is_refused(tmp_path):
    store = DirectoryStore(tmp_path)
    running = Lease.take(store, ["q"], "m1", what="start", ttl=600)
    target = tmp_path / "gates" / "q.json"
    with running.installed():
        atomic_write(target, "before")  # the owner writes
        aborting = Lease.take(store, ["q"], "m1", what="abort", ttl=600, preempt=True)
        assert aborting.preempted["q"]["epoch"] == 1
        with pytest.raises(LeaseLost, match="taken over"):
            atomic_write(target, "after")  # refused under the lease's lock
        with pytest.raises(LeaseLost):
            running.renew()
    assert target.read_text() == "before"
    assert read_lease(tmp_path, "q")["epoch"] == 2  # its release touched nothing
    assert not read_lease(tmp_path, "q")["released"]
    aborting.release()


def _race(path: str, ttl: float, start, out) -> None:
    store = DirectoryStore(path)
    start.wait()
    try:
        lease = Lease.take(store, ["q"], "m1", what="resume", ttl=ttl)
    except Refused:
        out.put("refused")
        return
    out.put(f"took {lease.epochs['q']}")
    time.sleep(2)  # still alive and holding while the others try


def test_taking_a_stale_lease_is_a_compare_and_set_one_of_many_wins(tmp_path):
    store = DirectoryStore(tmp_path)
    Lease.take(store, ["q"], "m0", what="start", ttl=1)
    _age(store, "q", 5, host="elsewhere")
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(str(tmp_path), 30.0, start, out))
             for _ in range(6)]
    for p in procs:
        p.start()
    start.set()
    said = sorted(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(30)
    assert said == ["refused"] * 5 + ["took 2"]


def test_every_write_after_the_loss_is_refused_and_the_files_stay_as_they_were(tmp_path):
    """The fencing is a property of the writes, not of the phases: a record, a gate, a
    start gate, a stop request, a removal; each checked under the lease's lock."""
    from gates.startgate import write_start_gate
    from migrate.record import Migration

    store = DirectoryStore(tmp_path)
    lease = Lease.take(store, ["q"], "m1", what="start", ttl=600)
    m = Migration(id="m1", query="q", new_plan="p.json", old_instance="q",
                  new_instance="q.g1")
    with lease.installed():
        m.save(store)
        store.request_stop("q.g1")
        Lease.take(store, ["q"], "m1", what="abort", ttl=600, preempt=True)
        before = {p: p.read_text() for p in tmp_path.rglob("*") if p.is_file()}
        writes = [lambda: m.save(store),
                  lambda: write_gate(tmp_path, "q", GateState("paused", epoch=9)),
                  lambda: write_start_gate(tmp_path, "q.g1", True, "m1"),
                  lambda: store.request_stop("q"), lambda: store.clear_stop("q.g1"),
                  lambda: store.set_status("q.g1", status="starting")]
        for w in writes:
            with pytest.raises(LeaseLost):
                w()
    after = {p: p.read_text() for p in tmp_path.rglob("*") if p.is_file()}
    after.pop(lease_path(tmp_path, "q"))
    before.pop(lease_path(tmp_path, "q"))
    assert after == before


class _CutOff(DirectoryStore):
    """A store whose publishing was fenced (another owner took the lease at the broker)
    and which this host cannot read any more (its mirror is cut off from the topic)."""

    def lease_publish(self, query: str, text: str, timeout: float) -> bool:
        return False

    def lease_sync(self, timeout: float) -> None:
        raise DeadlineExceeded("the Kafka store to be read to offset 9")


def test_a_fenced_owner_that_cannot_read_the_store_still_stops_with_one_line(tmp_path):
    lease = Lease.take(DirectoryStore(tmp_path), ["q"], "m1", what="start", ttl=3)
    lease.store = _CutOff(tmp_path)
    with pytest.raises(LeaseLost, match=r"of 'q' was taken over by another process \(its "
                                        r"producer was fenced at the broker\); this process "
                                        r"stops"):
        lease.renew(force=True)
    assert read_lease(tmp_path, "q")["seq"] == 1  # the fenced renewal wrote nothing here


def test_a_renewal_later_than_the_budget_while_paused_is_a_lapse(tmp_path):
    store = DirectoryStore(tmp_path)
    lease = Lease.take(store, ["q"], "m1", what="start", ttl=3)
    lease.renewed -= 2.5  # its budget is 2 s of the 3 s TTL
    lease.renew()  # not paused: a late renewal is just a renewal
    seq = read_lease(tmp_path, "q")["seq"]
    lease.critical = True
    lease.renewed -= 2.5
    with pytest.raises(Lapsed, match="without a renewal while the queries were paused"):
        lease.renew()
    # renewed all the same (the heartbeat is in ms: two renewals may share one)
    assert read_lease(tmp_path, "q")["seq"] == seq + 1
    lease.renewed -= 2.5
    with pytest.raises(Lapsed):  # a write after the lapse renews first, and says so
        with lease.guard():
            pass
    lease.release()


# -- what a stale lease lifts -------------------------------------------------------------

def test_only_a_leased_gate_lifts_and_only_with_its_lease_stale(tmp_path):
    store = DirectoryStore(tmp_path)
    pause = GateState("capped", {"t": {0: 5}}, epoch=2, lease="q")
    assert "nobody holds it" in lifted(tmp_path, pause)
    lease = Lease.take(store, ["q"], "m1", what="start", ttl=2)
    assert lifted(tmp_path, pause) is None  # fresh
    assert lifted(tmp_path, GateState("capped", {"t": {0: 5}}, epoch=3, retire="m1")) is None
    _age(store, "q", 3, host="elsewhere")
    assert "is stale: no heartbeat" in lifted(tmp_path, pause)
    cut = GateState("capped", {"t": {0: 5}}, epoch=3, retire="m1")  # never leased
    assert lifted(tmp_path, cut) is None
    (tmp_path / "leases" / "q.json").write_text("{")
    assert "cannot be read" in lifted(tmp_path, pause)
    lease._fds.clear()


def test_the_gated_source_reads_on_past_a_pause_whose_lease_is_stale(tmp_path, monkeypatch):
    from gates.source import TheseusKafkaSource
    from tests.test_cascade import FakeKafka

    FakeKafka({"t": {0: 50, 1: 60}}).install(monkeypatch)
    store = DirectoryStore(tmp_path)
    lease = Lease.take(store, ["q"], "m1", what="start", ttl=2)
    write_gate(tmp_path, "q", GateState("capped", {"t": {0: 10, 1: 10}}, epoch=2,
                                        lease="q"))
    reader = TheseusKafkaSource({"bootstrap": "x:1", "topic": "t", "format": "json",
                                 "schema": "k STRING", "store": str(tmp_path), "query": "q",
                                 "node": "in"}).streamReader(None)
    start = {"t": {"0": 10, "1": 10}}
    assert reader.latestOffset(start, None) == start  # paused at H while the lease holds
    lease.release()  # the migrator ended (failed, interrupted): lifted at once
    assert reader.latestOffset(start, None) == {"t": {"0": 50, "1": 60}}
    # the cap at the cut retires the old query: never lifted, whatever the lease
    write_gate(tmp_path, "q", GateState("capped", {"t": {0: 12, 1: 12}}, epoch=3,
                                        retire="m1"))
    assert reader.latestOffset(start, None) == {"t": {"0": 12, "1": 12}}


# -- catching up --------------------------------------------------------------------------

def _shadow_migration(tmp_path, phase: str, **kw):
    from compat.serde import dumps, from_doc
    from migrate.record import Migration
    from tests.test_cascade import up_plan

    store = DirectoryStore(tmp_path)
    store.put_plan("a", dumps(from_doc(up_plan("a"))))
    (tmp_path / "a2.json").write_text(json.dumps(up_plan("a", new=True)))
    m = Migration(id="m1", query="a", new_plan=str(tmp_path / "a2.json"), old_instance="a",
                  new_instance="a.g1", kind="shadow", phase=phase, **kw)
    m.save(store)
    return store, m


def test_a_resume_in_step_3_or_4_reopens_the_queries_and_pauses_again(tmp_path):
    from gates.startgate import read_start_gate, write_start_gate
    from migrate.context import Context
    from migrate.phases.catch_up import catch_up

    store, m = _shadow_migration(tmp_path, "cut", high={"s": {"0": 9}})
    h = GateState("capped", {"s": {0: 9}}, epoch=3, lease="a")
    write_gate(tmp_path, "a", h)
    write_gate(tmp_path, "a.g1", GateState("capped", {"s": {0: 9}}, epoch=4, lease="a"))
    write_start_gate(tmp_path, "a.g1", False, "m1", from_offsets={"s": {0: 11}},
                     follow="a", follow_offsets={"s": {0: 11}})
    lines: list[str] = []
    catch_up(m, Context(store, lines.append))
    assert m.phase == "pause" and m.high == {} and m.cut == {}
    assert read_gate(tmp_path, "a").mode == read_gate(tmp_path, "a.g1").mode == "open"
    assert "from" not in read_start_gate(tmp_path, "a.g1")
    assert "pausing again from the new high watermarks" in lines[0]
    assert [h[0] for h in m.history] == ["rewound"]


def test_a_resume_once_the_old_query_is_capped_at_the_cut_goes_on_with_step_5(tmp_path):
    from migrate.context import Context
    from migrate.phases.catch_up import catch_up

    store, m = _shadow_migration(tmp_path, "cut", high={"s": {"0": 9}},
                                 cut={"s": {"0": 11}})
    write_gate(tmp_path, "a", GateState("capped", {"s": {0: 11}}, epoch=5, retire="m1"))
    catch_up(m, Context(store, lambda s: None))
    assert m.phase == "align" and m.cut == {"s": {"0": 11}}


def test_an_old_query_read_past_the_cut_is_paused_again(tmp_path):
    from migrate.context import Context
    from migrate.phases.catch_up import catch_up

    store, m = _shadow_migration(tmp_path, "align", cut={"s": {"0": 11}})
    write_gate(tmp_path, "a", GateState("capped", {"s": {0: 11}}, epoch=5, retire="m1"))
    write_ack(tmp_path, "a", "s", {0: 11}, GateState())
    catch_up(m, Context(store, lambda s: None))
    assert m.phase == "align"  # at C exactly: it hands over
    write_ack(tmp_path, "a", "s", {0: 14}, GateState())
    catch_up(m, Context(store, lambda s: None))
    assert m.phase == "pause" and read_gate(tmp_path, "a").mode == "open"


def test_a_lapse_in_a_step_rewinds_the_run_to_the_pause(tmp_path, monkeypatch):
    from migrate import runner
    from migrate.context import Context

    store, m = _shadow_migration(tmp_path, "cut", high={"s": {"0": 9}})
    write_gate(tmp_path, "a", GateState("capped", {"s": {0: 9}}, epoch=3, lease="a"))
    lease = Lease.take(store, ["a"], "m1", what="resume", ttl=3)
    lease.critical = True
    lease.renewed -= 2.5  # hung for longer than its budget: readers may have lifted H
    with lease.installed():
        runner.step(m, Context(store, lambda s: None, lease=lease))
    assert m.phase == "pause" and not m.cut and read_gate(tmp_path, "a").mode == "open"


# -- the commands ----------------------------------------------------------------------------

def test_a_second_start_beside_a_live_migrator_is_refused_exit_6_naming_it(tmp_path):
    from click.testing import CliRunner

    from migrate.cli import main
    from tests.test_cascade import up_plan

    store = DirectoryStore(tmp_path / "st")
    p = tmp_path / "v3.json"
    p.write_text(json.dumps(up_plan("a", new=True)))
    holder = Lease.take(store, ["a"], "m7", what="start", ttl=600,
                        command="theseus migrate start v2.json")
    for cmd in (["migrate", "start", str(p), "--bootstrap", "h:1"],
                ["migrate", "resume", "a"]):
        if cmd[1] == "resume":  # a migration in flight, as the holder recorded it
            from migrate.record import Migration

            Migration(id="m7", query="a", new_plan=str(p), old_instance="a",
                      new_instance="a.g1", phase="shadow", kind="shadow").save(store)
        r = CliRunner().invoke(main, [*cmd, "--state", str(tmp_path / "st")])
        assert r.exit_code == 6, r.output
        assert f"refused: migration m7 of 'a' is run by pid {os.getpid()}" in r.output
        assert "theseus migrate start v2.json" in r.output
        assert "resume a" not in r.output and "Traceback" not in r.output
    holder.release()


def test_a_start_gate_holding_a_batch_lets_the_host_stop(tmp_path):
    import threading

    from gates.startgate import Abandoned, StartGate, write_start_gate

    write_gate(tmp_path, "old", GateState("capped", {"t": {0: 10}}, epoch=4, retire="m1"))
    write_start_gate(tmp_path, "new", False, "m1", from_offsets={"t": {0: 10}},
                     follow="old", follow_offsets={"t": {0: 10}})
    write_ack(tmp_path, "new", "t", {0: 10}, GateState())  # the batch from C
    gate = StartGate(tmp_path, "new")
    threading.Timer(0.3, gate.abandon.set).start()
    t0 = time.monotonic()
    with pytest.raises(Abandoned, match="runs again when the query restarts"):
        gate.is_open(7)  # the old query never hands over (its migrator is gone)
    assert gate.abandoned == 7 and time.monotonic() - t0 < 5


def test_stop_says_a_query_that_is_not_running_is_not_and_waits_for_one_that_is(tmp_path):
    import threading

    from click.testing import CliRunner

    from migrate.cli import main

    store = DirectoryStore(tmp_path)
    store.set_status("q", status="stopped", pid=os.getpid())  # (pytest: not a host)
    r = CliRunner().invoke(main, ["stop", "q", "--state", str(tmp_path)])
    assert r.exit_code == 6 and "'q' is not running (stopped); nothing to stop" in r.output
    store.set_status("q", status="running", pid=_dead_pid(), host=this_host())
    r = CliRunner().invoke(main, ["stop", "q", "--state", str(tmp_path)])
    assert r.exit_code == 6 and "is not running (its host, pid" in r.output

    store.set_status("q", status="running", pid=os.getpid(), host=this_host())

    def host() -> None:  # the host: stops after its batch once asked
        while not store.stop_requested("q"):
            time.sleep(0.05)
        time.sleep(0.5)
        store.set_status("q", status="stopped", last_batch=41)

    threading.Thread(target=host).start()
    r = CliRunner().invoke(main, ["stop", "q", "--state", str(tmp_path)])
    assert r.exit_code == 0 and r.output.strip() == "theseus: 'q' stopped after batch 41"
    store.set_status("q", status="running", pid=os.getpid(), host=this_host())
    r = CliRunner().invoke(main, ["stop", "q", "--state", str(tmp_path), "--timeout", "0.5"])
    assert r.exit_code == 4 and "did not stop within" in r.output


def test_a_second_start_beside_a_migration_nobody_runs_says_to_resume_or_abort_it(tmp_path):
    from click.testing import CliRunner

    from migrate.cli import main
    from migrate.record import Migration
    from tests.test_cascade import up_plan

    store = DirectoryStore(tmp_path / "st")
    store.set_status("a", status="running", pid=_dead_pid(), generation=0)
    p = tmp_path / "v3.json"
    p.write_text(json.dumps(up_plan("a", new=True)))
    Migration(id="m7", query="a", new_plan=str(p), old_instance="a", new_instance="a.g1",
              phase="pause", kind="shadow").save(store)
    Lease.take(store, ["a"], "m7", what="start", ttl=600).release()  # its owner ended
    r = CliRunner().invoke(main, ["migrate", "start", str(p), "--bootstrap", "h:1",
                                  "--state", str(tmp_path / "st")])
    assert r.exit_code == 6, r.output
    assert "migration m7 of 'a' is in phase pause and no process runs it" in r.output
    assert "theseus migrate resume a continues it" in r.output
    assert read_lease(tmp_path / "st", "a")["released"]  # the refused start let it go
