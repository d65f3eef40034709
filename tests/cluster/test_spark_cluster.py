"""Theseus on a Spark standalone cluster (master + two one-core workers, each with its own
working directory and a clean environment) and a three-broker Kafka cluster, against the
exact-output oracle; faults injected while queries run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.integration.conftest import KafkaHelper
from tests.integration.test_migration import input_records, oracle, plan, wait_for

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.cluster]


def count_plan(query: str, src: str, out: str, *, schema=(("k", "string"), ("x", "bigint")),
               key: str = "k", summed: str = "x") -> dict:
    """Per ``key`` (an expression over ``schema``), the count and the sum of ``summed``;
    update mode, exactly once (its state lives in the executors' state stores)."""
    return {
        "format": "theseus.plan/1", "query": query, "config": {"state_partitions": 2},
        "nodes": [
            {"id": "events", "step": "source", "version": 1, "topic": src, "partitions": 3,
             "format": "json", "role": "stream",
             "schema": [{"name": n, "type": t} for n, t in schema]},
            {"id": "agg", "step": "aggregate", "version": 1, "inputs": ["events"],
             "group_by": [{"name": "k", "expr": key}],
             "aggregates": [{"name": "n", "function": "count", "args": ["*"]},
                            {"name": "s", "function": "sum", "args": [summed]}]},
            {"id": "out", "step": "sink", "version": 1, "inputs": ["agg"], "topic": out,
             "format": "json", "key_columns": ["k"], "mode": "update",
             "delivery": "exactly_once"}]}


def driver_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("THESEUS_")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def theseus(*args, cwd: Path, env: dict | None = None, timeout: float = 600):
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, "-m", "migrate.cli", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, env=env or driver_env(),
                          timeout=timeout)


def spawn(*args, cwd: Path, log: Path, env: dict | None = None) -> subprocess.Popen:
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "migrate.cli", *map(str, args)], cwd=cwd,
                            env=env or driver_env(), stdout=open(log, "ab"),
                            stderr=subprocess.STDOUT)


def replicas(k: KafkaHelper, topic: str) -> set[int]:
    md = k.admin.list_topics(topic, timeout=30).topics[topic]
    return {len(p.replicas) for p in md.partitions.values()}


def check_counts(k: KafkaHelper, src: str, out: str, key=lambda v: v["k"],
                 value=lambda v: v["x"]) -> int:
    """Update-mode counts: per key, the counts written only grow (no batch written twice, no
    state lost and recounted), and the last value is the count and the sum over every input
    record.  Returns the number of input records."""
    want_n: Counter = Counter()
    want_s: Counter = Counter()
    inputs = input_records(k, src)
    for r in inputs:
        v = r.json()
        want_n[key(v)] += 1
        want_s[key(v)] += value(v)
    seen = defaultdict(list)
    for r in k.read_all(out):
        v = r.json()
        seen[v["k"]].append((v["n"], v["s"]))
    assert set(seen) == set(want_n)
    for k_, vals in seen.items():
        ns = [n for n, _ in vals]
        assert ns == sorted(set(ns)), f"key {k_}: a count written twice or going back {ns}"
        assert vals[-1] == (want_n[k_], want_s[k_]), k_
    return len(inputs)


@pytest.mark.cluster_ci
def test_run_on_the_cluster_with_the_kafka_store_is_exact(kafka3, spark_cluster, tmp_path):
    k = KafkaHelper(kafka3.bootstrap, replication=-1)
    src, out = k.topic("cl-in", 3), k.topic("cl-out", 2)
    assert replicas(k, src) == {3}
    rows = [{"k": f"k{i % 17}", "x": i} for i in range(3000)]
    k.produce(src, rows, keys=[r["k"] for r in rows])
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(count_plan("clrun", src, out)))
    store_topic = f"it-store-{uuid.uuid4().hex[:8]}"
    state = f"kafka://{kafka3.bootstrap.split(',')[0]}/{store_topic}"
    t0 = time.monotonic()
    r = theseus("run", p, "--bootstrap", kafka3.bootstrap, "--state", state,
                "--master", spark_cluster.master, "--available-now", cwd=tmp_path / "driver")
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    check_counts(k, src, out)
    # the store topic follows the cluster's replication factor
    assert replicas(k, store_topic) == {3}
    # the executors ran this checkout's code, shipped with the job (not the workers' path)
    shipped = list(spark_cluster.state.glob("worker*/work/app-*/*/theseus-code.zip"))
    assert shipped, "no executor received the shipped code"
    print(f"cluster run: 3000 rows in {took:.1f} s (including Spark start-up)")


class Feeder(threading.Thread):
    """{"id": i, "v": "x<i>"} into 3 partitions at a steady rate (acks=all: survives the
    loss of one broker of three)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Producer

        self.p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                           "acks": "all"})
        self.topic, self.n, self.halt = topic, 0, threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            for _ in range(4):
                self.p.produce(self.topic, json.dumps({"id": self.n, "v": f"x{self.n}"}),
                               partition=self.n % 3)
                self.n += 1
            self.p.poll(0)
            time.sleep(0.1)
        assert self.p.flush(60) == 0

    def stop(self) -> None:
        self.halt.set()
        self.join(90)


def feed_count_plan(query: str, src: str, out: str) -> dict:
    """The stateful plan over the feeder's records: per ``id % 17``, count and sum of ids."""
    return count_plan(query, src, out, schema=(("id", "bigint"), ("v", "string")),
                      key="id % 17", summed="id")


def check_feed_counts(k: KafkaHelper, src: str, out: str) -> int:
    """:func:`check_counts` for :func:`feed_count_plan`."""
    return check_counts(k, src, out, key=lambda v: v["id"] % 17, value=lambda v: v["id"])


def spark_events(events_dir: Path) -> list[dict]:
    """Every event of the Spark event logs in ``events_dir`` (uncompressed JSON lines;
    Spark 4 rolls them: ``eventlog_v2_<app>/events_<n>_<app>``)."""
    out = []
    for f in sorted(events_dir.rglob("*"), key=lambda f: (f.parent.name, f.name)):
        if not f.is_file() or f.name.startswith(".") or f.name.startswith("appstatus"):
            continue
        for line in f.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:  # the last line of a log still being written
                pass
    return out


def executor_loss(events: list[dict], killed_ms: int) -> dict:
    """What the driver saw of a worker killed at ``killed_ms`` (epoch ms): the executors it
    removed then, the executors added after, the tasks that failed with a lost executor,
    and the tasks that succeeded on another executor after the removal."""
    removed = [e for e in events if e.get("Event") == "SparkListenerExecutorRemoved"
               and e["Timestamp"] >= killed_ms - 1000]
    lost = {e["Executor ID"] for e in removed}
    gone_at = max((e["Timestamp"] for e in removed), default=killed_ms)
    added = [e for e in events if e.get("Event") == "SparkListenerExecutorAdded"
             and e["Timestamp"] > killed_ms]
    ends = [e for e in events if e.get("Event") == "SparkListenerTaskEnd"]
    failed = [e for e in ends if e["Task End Reason"]["Reason"] != "Success"]
    after = [e for e in ends if e["Task End Reason"]["Reason"] == "Success"
             and e["Task Info"]["Executor ID"] not in lost
             and e["Task Info"]["Finish Time"] > gone_at]
    return {"removed": [(e["Executor ID"], e.get("Removed Reason", "")) for e in removed],
            "added": [e["Executor ID"] for e in added],
            "failed": [(e["Task Info"]["Executor ID"], e["Task End Reason"]["Reason"])
                       for e in failed],
            "tasks_after": len(after),
            "executors_after": sorted({e["Task Info"]["Executor ID"] for e in after})}


@pytest.mark.parametrize("stateful", [False, pytest.param(True, marks=pytest.mark.cluster_ci)],
                         ids=["stateless", "stateful"])
def test_worker_killed_at_steady_state_output_stays_exact(kafka3, spark_cluster, tmp_path,
                                                          stateful):
    """Fault 3: a worker SIGKILLed while the query runs on both workers; Spark removes its
    executor and runs the query's tasks on the other; the worker comes back after 10 s and
    gets a new executor.  Asserted from the driver's Spark event log (executor removed,
    tasks succeeding on another executor after the removal, an executor added), then the
    exact oracle: the projection's records each once; the aggregate's (its state in the
    executors' state stores, reloaded from the checkpoint elsewhere) counts only growing
    and ending at the count and sum over every input record."""
    k = KafkaHelper(kafka3.bootstrap, replication=-1)
    src, out = k.topic("w-in", 3), k.topic("w-out", 1)
    query = f"wk{uuid.uuid4().hex[:6]}"
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(feed_count_plan(query, src, out) if stateful
                            else plan(query, src, out, "old", False)))
    state = tmp_path / "state"
    events_dir = tmp_path / "spark-events"
    events_dir.mkdir()
    env = driver_env(THESEUS_SPARK_CONF=f"spark.eventLog.enabled=true;spark.eventLog.dir="
                                        f"file://{events_dir};spark.eventLog.compress=false")
    feeder = Feeder(kafka3.bootstrap, src)
    feeder.start()
    host = spawn("run", p, "--bootstrap", kafka3.bootstrap, "--state", state,
                 "--master", spark_cluster.master, cwd=tmp_path / "host",
                 log=tmp_path / "host.log", env=env)
    try:
        from migrate.store import DirectoryStore

        store = DirectoryStore(state)
        wait_for(lambda: store.status(query).get("status") == "running", 240, "query up")
        wait_for(lambda: k.end_offsets(out, settle=0)[0] > (20 if stateful else 100), 120,
                 "steady output")
        killed_ms = int(time.time() * 1000)
        spark_cluster.kill(1)
        time.sleep(10)
        spark_cluster.restart(1)
        # The restarted worker registers with the master and gets an executor for the
        # running application; on a loaded machine its JVM can take longer than a fixed
        # sleep, so wait for the driver to log the new executor while input still flows.
        wait_for(lambda: executor_loss(spark_events(events_dir), killed_ms)["added"], 180,
                 "the restarted worker gets an executor")
        feeder.stop()
        from gates.state import is_acked

        high = {src: k.end_offsets(src)}
        wait_for(lambda: is_acked(state, query, high), 240, "the query drains the input")
        assert host.poll() is None, (tmp_path / "host.log").read_text()[-3000:]
        r = theseus("stop", query, "--state", state, cwd=tmp_path / "host")
        assert r.returncode == 0, r.stderr
        host.wait(120)
    finally:
        feeder.stop()
        if host.poll() is None:
            host.kill()
    loss = executor_loss(spark_events(events_dir), killed_ms)
    print(f"worker 1 killed: executors removed {loss['removed']}, added after "
          f"{loss['added']}, failed tasks {loss['failed']}, {loss['tasks_after']} tasks "
          f"succeeded after the removal on executors {loss['executors_after']}")
    assert loss["removed"], "the driver never lost an executor: the kill hit no executor"
    assert loss["tasks_after"] > 0, "no task ran on another executor after the loss"
    assert loss["added"], "the restarted worker got no executor"
    if stateful:
        n = check_feed_counts(k, src, out)
        assert n > 300
        return
    got = Counter(json.dumps(r.json(), sort_keys=True) for r in k.read_all(out))
    want = oracle(input_records(k, src), {"0": 1 << 62, "1": 1 << 62, "2": 1 << 62})
    assert sum(want.values()) > 300
    assert got == want, (f"missing {sum((want - got).values())}, "
                         f"extra {sum((got - want).values())}")


def leader_of(k: KafkaHelper, topic: str, partition: int = 0) -> int:
    return k.admin.list_topics(topic, timeout=30).topics[topic].partitions[partition].leader


def phase_of(ctx) -> str:
    """The migration's phase, and whether the shadow has caught up with the head."""
    from migrate import migration

    try:
        m = migration.current(ctx.store, ctx.query)
    except Exception:  # noqa: BLE001 (no migration recorded yet)
        return "none"
    done = any(h[0] == "caught_up" for h in m.history)
    return f"{m.phase}{' (caught up)' if done else ''}"


def migrate_with_fault(kafka3, spark_cluster, tmp_path, when, fault, *,
                       kafka_store: bool = False, expect_phase: tuple | None = None) -> None:
    """The stateless migration of ``tests/integration/test_migration`` on the Spark cluster
    and the three brokers (each query one executor: ``spark.cores.max=1``), with
    ``fault(ctx)`` run in a thread once ``when(ctx)`` holds.  The old query's host and the
    migrator run in two different working directories; with ``kafka_store`` they share
    nothing but the brokers (``--state kafka://...``, each with its own local mirror).
    Ends with the exact oracle: old plan before the cut, new plan from it, nothing lost or
    twice; or, when the migration was refused or aborted, the old plan over everything."""
    from gates.state import is_acked
    from migrate import migration
    from migrate.store import open_store

    k = KafkaHelper(kafka3.bootstrap, replication=-1)
    src, out = k.topic("f-in", 3), k.topic("f-out", 1)
    query = f"f{uuid.uuid4().hex[:6]}"
    old_p, new_p = tmp_path / "v1.json", tmp_path / "v2.json"
    old_p.write_text(json.dumps(plan(query, src, out, "old", False)))
    new_p.write_text(json.dumps(plan(query, src, out, "new", True)))
    store_topic = f"it-store-{uuid.uuid4().hex[:8]}"
    state = f"kafka://{kafka3.bootstrap}/{store_topic}" if kafka_store \
        else str(tmp_path / "state")
    env = driver_env(THESEUS_SPARK_CONF="spark.cores.max=1")
    host_env = {**env, "THESEUS_LOCAL_DIR": str(tmp_path / "host" / ".theseus")}
    mig_env = {**env, "THESEUS_LOCAL_DIR": str(tmp_path / "migrator" / ".theseus")}
    feeder = Feeder(kafka3.bootstrap, src)
    feeder.start()

    def start_host() -> subprocess.Popen:
        return spawn("run", old_p, "--bootstrap", kafka3.bootstrap, "--state", state,
                     "--master", spark_cluster.master, cwd=tmp_path / "host",
                     log=tmp_path / "host.log", env=host_env)

    ctx = SimpleNamespace(k=k, src=src, query=query, host=start_host(), start_host=start_host,
                          store_topic=store_topic, t0=None, events=[], fired_in=None,
                          fired_at=None)
    local_dir = os.environ.get("THESEUS_LOCAL_DIR")
    if kafka_store:
        os.environ["THESEUS_LOCAL_DIR"] = str(tmp_path / "test" / ".theseus")
    store = ctx.store = open_store(state)
    fired = threading.Event()
    errors: list[BaseException] = []

    def watch() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not fired.is_set():
            try:
                if when(ctx):
                    ctx.fired_at, ctx.fired_in = time.monotonic(), phase_of(ctx)
                    fired.set()
                    fault(ctx)
                    ctx.events.append(f"after the fault the migration is in {phase_of(ctx)}")
                    return
            except Exception as e:  # noqa: BLE001 (reported by the test)
                errors.append(e)
                return
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    try:
        wait_for(lambda: store.status(query).get("status") == "running", 240, "old query up")
        wait_for(lambda: k.end_offsets(out, settle=0)[0] > 50, 120, "old output")
        ctx.t0 = time.monotonic()
        watcher.start()
        r = theseus("migrate", "start", new_p, "--bootstrap", kafka3.bootstrap, "--state",
                    state, "--strategy", "shadow", "--master", spark_cluster.master,
                    "--timeout", "500", cwd=tmp_path / "migrator", env=mig_env, timeout=700)
        watcher.join(120)
        assert not errors, errors
        assert fired.is_set(), "the fault never fired"
        print(f"fault fired {ctx.fired_at - ctx.t0:.1f} s into the migration, in phase "
              f"{ctx.fired_in}; then {', '.join(ctx.events)}")
        if expect_phase is not None:
            assert ctx.fired_in.split()[0] in expect_phase, (ctx.fired_in, expect_phase)
        m = migration.current(store, query)
        if r.returncode != 0:
            # refused or failed: one line saying so, then a clean abort
            assert "Traceback" not in r.stderr, r.stderr
            print("migration failed:", r.stderr.strip()[-2000:])
            if m.phase not in ("refused", "aborted"):
                a = theseus("migrate", "abort", query, "--state", state,
                            cwd=tmp_path / "migrator", env=mig_env)
                assert a.returncode == 0, a.stdout + a.stderr
                m = migration.current(store, query)
        time.sleep(3)
        feeder.stop()
        live = store.live_instance(query)
        high = {src: k.end_offsets(src)}

        def drained() -> bool:
            st = store.status(live)
            assert st.get("status") != "failed", f"the live query {live} failed: " + \
                str(st.get("error"))[:3000]
            return is_acked(store.root, live, high)

        wait_for(drained, 300, "the live query drains the input")
        s = theseus("stop", query, "--state", state, cwd=tmp_path / "host", env=host_env)
        assert s.returncode == 0, s.stderr
        wait_for(lambda: store.status(live).get("status") == "stopped", 120, "live stops")
        ctx.host.wait(120)
    finally:
        feeder.stop()
        if ctx.host.poll() is None:
            ctx.host.kill()
        if local_dir is None:
            os.environ.pop("THESEUS_LOCAL_DIR", None)
        else:
            os.environ["THESEUS_LOCAL_DIR"] = local_dir
        for inst in list((store.root / "queries").glob("*")):
            pid = store.status(inst.name).get("pid")
            if pid and inst.name != query:
                try:
                    os.kill(int(pid), 9)  # a shadow this test's migrator started
                except (ProcessLookupError, PermissionError, ValueError):
                    pass
    got = Counter(json.dumps(x.json(), sort_keys=True) for x in k.read_all(out))
    if m.phase == "done":
        want = oracle(input_records(k, src), m.cut[src])
        assert {json.loads(x)["tag"] for x in got} == {"old", "new"}
    else:
        want = oracle(input_records(k, src), {"0": 1 << 62, "1": 1 << 62, "2": 1 << 62})
    print(f"migration ended {m.phase}: {sum(got.values())} output records")
    assert got == want, (f"phase {m.phase}: missing {sum((want - got).values())}, "
                         f"extra {sum((got - want).values())}")


def _phase(phase: str):
    def when(ctx) -> bool:
        from migrate import migration

        try:
            return migration.current(ctx.store, ctx.query).phase == phase
        except Exception:  # noqa: BLE001 (no migration recorded yet)
            return False
    return when


def _kill_leader_for_10s(kafka3, topic_of):
    def fault(ctx) -> None:
        node = leader_of(ctx.k, topic_of(ctx), 0)
        kafka3.kill(node)
        ctx.events.append(f"broker {node} killed in {phase_of(ctx)}")
        time.sleep(10)
        ctx.events.append(f"restarted in {phase_of(ctx)}")
        kafka3.restart(node)
    return fault


def _kill_source_leader_for_10s(kafka3):
    return _kill_leader_for_10s(kafka3, lambda ctx: ctx.src)


def _backfilling(ctx) -> bool:
    """The shadow's query runs (its Spark driver is up) and has not caught up yet."""
    return phase_of(ctx) in ("shadow", "pause") and \
        ctx.store.status(f"{ctx.query}.g1").get("status") == "running"


def test_broker_killed_during_the_shadow_backfill(kafka3, spark_cluster, tmp_path):
    """Fault 1: the leader of a source partition SIGKILLed while the shadow backfills,
    restarted after 10 s."""
    migrate_with_fault(kafka3, spark_cluster, tmp_path, _backfilling,
                       _kill_source_leader_for_10s(kafka3), expect_phase=("shadow", "pause"))


def test_broker_killed_between_the_cut_and_the_hand_over(kafka3, spark_cluster, tmp_path):
    """Fault 2: a broker SIGKILLed once the control events are written (phase align), while
    both queries run up to the cut and the acknowledgements decide the hand-over.  On the
    Kafka store: the acknowledgements, the gate state and the migration record then cross
    the failure too (the store topic has a replica on every broker of three: the killed one
    led it, or its ISR shrinks and the store's acks=all writes wait for the controller to
    fence the dead broker)."""
    def fault(ctx) -> None:
        node, store_leader = leader_of(ctx.k, ctx.src, 0), leader_of(ctx.k, ctx.store_topic)
        kafka3.kill(node)
        ctx.events.append(f"broker {node} (the store topic's leader: {store_leader}) killed "
                          f"in {phase_of(ctx)}")
        time.sleep(10)
        ctx.events.append(f"restarted in {phase_of(ctx)}")
        kafka3.restart(node)

    migrate_with_fault(kafka3, spark_cluster, tmp_path, _phase("align"), fault,
                       kafka_store=True, expect_phase=("align",))


def test_old_driver_killed_during_align_restarts_on_its_checkpoint(kafka3, spark_cluster,
                                                                 tmp_path):
    """Fault 4: the old query's driver SIGKILLed during align, restarted by `theseus run`
    on its checkpoint (its executors die with it; the new driver gets new ones)."""
    def fault(ctx) -> None:
        ctx.host.kill()
        ctx.host.wait(30)
        ctx.events.append(f"old driver killed (exit {ctx.host.returncode}) in "
                          f"{phase_of(ctx)}")
        time.sleep(2)
        ctx.host = ctx.start_host()
        ctx.events.append(f"restarted in {phase_of(ctx)}")

    migrate_with_fault(kafka3, spark_cluster, tmp_path, _phase("align"), fault,
                       expect_phase=("align",))


def _caught_up(ctx) -> bool:
    """The shadow has caught up with the head: from here to the hand-over the migrator
    writes the gates' caps and reads the queries' acknowledgements through the store."""
    return phase_of(ctx) in ("pause (caught up)", "cut", "cut (caught up)",
                             "align", "align (caught up)")


def test_store_leader_killed_mid_migration_with_the_kafka_store(kafka3, spark_cluster,
                                                                tmp_path):
    """Fault 5: migrator and query host in two working directories sharing only the brokers
    (the Kafka store); the store topic's leader SIGKILLed once the shadow has caught up
    (pause, or cut/align if the watcher sees it late), restarted after 10 s: the caps, the
    cut and the acknowledgements go through a store whose leader is moving."""
    migrate_with_fault(kafka3, spark_cluster, tmp_path, _caught_up,
                       _kill_leader_for_10s(kafka3, lambda ctx: ctx.store_topic),
                       kafka_store=True, expect_phase=("pause", "cut", "align"))
