"""Issue 32, problems 3 and 6, on a real broker and real Spark.

Problem 3, as it was met: ``migrate start`` with a plan that reads an empty topic
(``op_orders_eu`` instead of ``op_orders``) finished with exit 0 after "reconciled at the
cut: 0 corrected, 0 added, 30 deleted": no live key left in the output, control records in
the wrong topic.  Now the delete guard stops it before the cut (exit 6, the counts), nothing
is written to the output or the source topics, the old query runs on and its output stays
exact; with ``--allow-deletes`` the migration goes through.  A dry run counts what a
reconciling migration then does, to the key.  A source topic that does not exist is refused
naming the user's plan file, and the first ``theseus run`` on a missing output topic creates
it as the plan says (problem 6's raw ``KafkaError{code=UNKNOWN_TOPIC_OR_PART}``).

Small data, no live feeder: each test sends its input, lets the old query take it, then
migrates (a dry run's corrected/matched counts depend on timing when input flows)."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections import defaultdict

import pytest

from tests.integration.test_migration import spawn_run, theseus, wait_for
from tests.integration.test_reconcile import compacted
from tests.migrator_fakes import agg_doc

pytestmark = [pytest.mark.integration, pytest.mark.own_jvm]

KEYS = [f"k{i:02d}" for i in range(30)]


def sums(inputs, keep=lambda k: True, value=lambda k, x: x) -> dict:
    """The oracle of a sum per key: the output a reader of the compacted topic sees."""
    out: dict = defaultdict(int)
    for r in inputs:
        v = r.json()
        if keep(v["k"]):
            out[v["k"]] += value(v["k"], v["x"])
    return {k: {"k": k, "s": s} for k, s in out.items()}


def send(kafka, topic: str, rounds: int = 2, start: int = 0) -> None:
    """``rounds`` records per key, x = 1, 2, 3... in order."""
    values = [{"k": k, "x": start + i + 1} for i, k in enumerate(KEYS * rounds)]
    kafka.produce(topic, values, keys=[{"k": v["k"]} for v in values])


def controls(kafka, topic: str) -> list:
    from gates.control import is_control

    return [r for r in kafka.read_all(topic) if is_control(r.headers)]


def inputs_of(kafka, topic: str) -> list:
    from gates.control import is_control

    return [r for r in kafka.read_all(topic) if not is_control(r.headers)]


def topic_exists(kafka, topic: str) -> bool:
    return topic in kafka.admin.list_topics(timeout=30).topics


class Old:
    """The old query under ``theseus run``, with its plan file, store and topics."""

    def __init__(self, kafka, tmp_path, doc: dict) -> None:
        from migrate.store import DirectoryStore

        self.kafka, self.tmp = kafka, tmp_path
        self.query, self.state = doc["query"], tmp_path / "state"
        self.plan = tmp_path / "v1.json"
        self.plan.write_text(json.dumps(doc))
        self.proc = spawn_run(self.plan, kafka.bootstrap, self.state)
        self.store = DirectoryStore(self.state)
        wait_for(lambda: self.store.status(self.query).get("status") == "running", 180,
                 "the old query runs")

    def caught_up(self, src: str) -> None:
        from gates.state import is_acked

        live = self.store.live_instance(self.query)
        high = {src: self.kafka.end_offsets(src)}
        wait_for(lambda: is_acked(self.state, live, high), 180, f"{live} reads {src}")

    def new_plan(self, doc: dict, name: str) -> str:
        p = self.tmp / name
        p.write_text(json.dumps(doc))
        return str(p)

    def migrate(self, *args: str, timeout: float = 300):
        return theseus("migrate", *args, "--state", str(self.state), timeout=timeout + 60,
                       env=dict(os.environ))

    def start(self, plan: str, *flags: str):
        return self.migrate("start", plan, "--bootstrap", self.kafka.bootstrap, "--timeout",
                            "300", *flags)

    def stop(self) -> None:
        live = self.store.live_instance(self.query)
        assert theseus("stop", self.query, "--state", str(self.state)).returncode == 0
        wait_for(lambda: self.store.status(live).get("status") == "stopped", 120,
                 f"{live} stops")
        self.proc.wait(60)


def test_a_plan_reading_an_empty_topic_is_refused_before_the_cut(kafka, tmp_path):
    """Problem 3 as written, then the same migration with --allow-deletes."""
    from gates.state import read_gate
    from migrate import migration

    src = kafka.topic(prefix="op-orders", partitions=3)
    eu = kafka.topic(prefix="op-orders-eu", partitions=3)  # exists, and stays empty
    out = kafka.topic(prefix="op-totals", partitions=2, config={"cleanup.policy": "compact"})
    query = f"g{tmp_path.name[-6:]}".replace("-", "_")
    send(kafka, src)
    old = Old(kafka, tmp_path, agg_doc(query, src, out))
    old.caught_up(src)
    assert compacted(kafka.read_all(out)) == sums(inputs_of(kafka, src))
    v3 = old.new_plan(agg_doc(query, eu, out), "v3.json")
    ends = {t: kafka.end_offsets(t) for t in (src, eu, out)}

    r = old.start(v3)
    assert r.returncode == 6, r.stdout + r.stderr
    errs = [ln for ln in r.stderr.splitlines() if ln.startswith("theseus: error:")]
    assert len(errs) == 1 and "Traceback" not in r.stderr, r.stderr
    assert errs[0].startswith(f"theseus: error: {v3}: ") and ".plan.json" not in errs[0]
    assert "30 of the output's 30 keys (100%) deleted: 0 corrected, 0 added, 30 deleted, " \
           "0 already right" in errs[0] and "--allow-deletes" in errs[0]
    assert f"reads topic '{eu}', which is empty" in r.stdout  # the preflight's warning
    # nothing written to the output or the source topics, and no side topic left
    assert {t: kafka.end_offsets(t) for t in (src, eu, out)} == ends
    assert controls(kafka, src) == controls(kafka, eu) == []
    assert not topic_exists(kafka, f"{out}.shadow")
    m = migration.current(old.store, query)
    assert m.phase == "refused" and m.guard["deleted"] == m.guard["keys"] == 30
    # the old query runs on, uncapped, and its output stays exact
    assert old.proc.poll() is None and read_gate(old.state, query).mode == "open"
    send(kafka, src, rounds=1, start=100)
    old.caught_up(src)
    assert compacted(kafka.read_all(out)) == sums(inputs_of(kafka, src))
    assert old.migrate("resume", query).returncode == 6  # nothing to resume

    r = old.start(v3, "--allow-deletes")
    assert r.returncode == 0, r.stdout + r.stderr
    m = migration.current(old.store, query)
    assert m.phase == "done"
    assert {k: m.counts[k] for k in ("corrected", "added", "deleted", "matched")} == \
        {"corrected": 0, "added": 0, "deleted": 30, "matched": 0}
    # the new plan over all input at C: nothing; every key tombstoned, once
    view = compacted(kafka.read_all(out))
    assert view == dict.fromkeys(KEYS)
    old.stop()


def test_a_dry_run_counts_what_the_migration_then_reconciles(kafka, tmp_path):
    """A reconciling migration with every kind of correction: k03 filtered out now
    (deleted), k28 and k29 kept now (added), k10..k27 computed anew (corrected), k00..k09
    the same (already right).  The dry run's counts are the real run's, and the dry run
    writes nothing: no control event, nothing in the output, no topic left, no migration."""
    from migrate import migration

    src = kafka.topic(prefix="dry-in", partitions=3)
    out = kafka.topic(prefix="dry-out", partitions=2, config={"cleanup.policy": "compact"})
    query = f"d{tmp_path.name[-6:]}".replace("-", "_")
    send(kafka, src)
    old = Old(kafka, tmp_path, agg_doc(query, src, out, filt="k not in ('k28', 'k29')"))
    old.caught_up(src)
    v2 = old.new_plan(agg_doc(query, src, out, filt="k <> 'k03'",
                              arg="CASE WHEN k < 'k10' THEN x ELSE 2 * x END"), "v2.json")
    ends = {t: kafka.end_offsets(t) for t in (src, out)}

    t0 = time.monotonic()
    r = old.start(v2, "--require", "backfill", "--dry-run", "--format", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    print(f"dry run: {time.monotonic() - t0:.1f} s")
    report = json.loads(r.stdout)
    assert report["reconciliation"] == {"corrected": 18, "added": 2, "deleted": 1,
                                        "matched": 9, "keys": 28}
    assert report["delete_guard"]["refuses"] is False
    assert report["topics_created"] == [f"{out}.shadow"]
    assert report["control_events"] == {"count": 3, "topics": {src: 3}}
    assert {t: kafka.end_offsets(t) for t in (src, out)} == ends
    assert controls(kafka, src) == [] and not topic_exists(kafka, f"{out}.shadow")
    r = old.migrate("status", query)
    assert (r.returncode, r.stdout) == (0, f"query '{query}': no migration\n")

    r = old.start(v2, "--require", "backfill")
    assert r.returncode == 0, r.stdout + r.stderr
    m = migration.current(old.store, query)
    assert m.phase == "done" and m.id != report["migration"]
    counts = {k: m.counts[k] for k in ("corrected", "added", "deleted", "matched")}
    assert counts == {k: report["reconciliation"][k] for k in counts}
    assert m.guard["deleted"] == 1 and m.guard["keys"] == 28  # the guard's count at H
    # the new plan over all input, for every key
    view = {k: v for k, v in compacted(kafka.read_all(out)).items() if v is not None}
    assert view == sums(inputs_of(kafka, src), keep=lambda k: k != "k03",
                        value=lambda k, x: x if k < "k10" else 2 * x)
    old.stop()


def test_a_missing_source_topic_is_refused_naming_the_plan_file(kafka, tmp_path):
    """No Spark: the refusal comes at step 1, before a shadow or a control event."""
    from compat.serde import dumps, from_doc
    from migrate import migration
    from migrate.store import DirectoryStore

    src = kafka.topic(prefix="ms-in", partitions=3)
    out = kafka.topic(prefix="ms-out", partitions=2)
    missing = f"it-ms-eu-{uuid.uuid4().hex[:10]}"
    store = DirectoryStore(tmp_path / "state")
    store.put_plan("q", dumps(from_doc(agg_doc("q", src, out))))
    store.set_status("q", status="running", pid=os.getpid(), generation=0)
    v3 = tmp_path / "v3.json"
    v3.write_text(json.dumps(agg_doc("q", missing, out)))
    r = theseus("migrate", "start", str(v3), "--bootstrap", kafka.bootstrap, "--state",
                str(store.root), timeout=120)
    assert r.returncode == 6, r.stdout + r.stderr
    errs = [ln for ln in r.stderr.splitlines() if ln.startswith("theseus: error:")]
    assert errs == [f"theseus: error: {v3}, node 'orders', at /nodes/0/topic: source "
                    f"'orders' reads topic '{missing}', which does not exist (expected an "
                    f"existing topic, found no topic '{missing}' on {kafka.bootstrap}). "
                    "create the topic, or correct its name in the plan; nothing was "
                    "written"], r.stderr
    assert not topic_exists(kafka, missing)  # not created by anything on the way
    assert controls(kafka, src) == [] and not store.query_dir("q.g1").exists()
    assert migration.current(store, "q").phase == "refused"
    r = theseus("migrate", "resume", "q", "--state", str(store.root))
    assert r.returncode == 6 and "nothing to resume" in r.stderr


def test_the_first_run_on_a_missing_output_topic_creates_it(kafka, tmp_path):
    """Problem 6's first run: the output topic is created before Spark starts, with the
    source's partitions and compacted (a keyed update output), and the output is exact; a
    missing source topic is refused in one line before Spark starts."""
    from confluent_kafka.admin import ConfigResource

    src = kafka.topic(prefix="first-in", partitions=3)
    out = f"it-first-out-{uuid.uuid4().hex[:10]}"
    kafka.created.append(out)  # deleted with the others
    send(kafka, src)
    plan = tmp_path / "v1.json"
    plan.write_text(json.dumps(agg_doc("first", src, out)))
    r = theseus("run", str(plan), "--bootstrap", kafka.bootstrap, "--state",
                str(tmp_path / "state"), "--available-now", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"theseus: created the output topic '{out}': 3 partition(s) as source 'orders' " \
           "declares, compacted: a keyed update output is a table" in r.stdout
    md = kafka.admin.list_topics(out, timeout=30).topics[out]
    assert len(md.partitions) == 3
    conf = kafka.admin.describe_configs([ConfigResource("topic", out)])
    policy = next(iter(conf.values())).result(30)["cleanup.policy"].value
    assert policy == "compact"
    assert compacted(kafka.read_all(out)) == sums(inputs_of(kafka, src))

    nowhere = f"it-first-none-{uuid.uuid4().hex[:10]}"
    plan.write_text(json.dumps(agg_doc("first", nowhere, out)))
    t0 = time.monotonic()
    r = theseus("run", str(plan), "--bootstrap", kafka.bootstrap, "--state",
                str(tmp_path / "state2"), timeout=120)
    assert r.returncode == 6, r.stdout + r.stderr
    assert r.stderr.count("\n") == 1 and f"'{nowhere}', which does not exist" in r.stderr
    assert time.monotonic() - t0 < 30 and not topic_exists(kafka, nowhere)
