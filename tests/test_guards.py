"""Issue 32, item 3: guards against destructive migrations, without services (the migrator's
Kafka and query hosts are :mod:`tests.migrator_fakes`'s; the store, the records, the gates,
the runner and the CLI are real).  The same problems on a real broker and real Spark:
``tests/integration/test_guards.py``.

* the preflight refuses a missing source topic and warns on an empty one, before anything
  is written (no shadow, no gate, no control event);
* the delete guard of step 3 stops a reconciliation that would delete too much of the
  output, rolling the pause back;
* ``migrate start --dry-run`` runs the shadow to the head and reports, without a cut, and
  leaves the query's current migration as it found it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from compat.errors import Refused
from compat.serde import from_doc
from gates.reconcile import COUNTS, Comparison, Reconciler
from gates.state import GateState, read_gate, write_gate
from migrate import migration, plantopics, runner
from migrate.cli import main
from migrate.context import Context
from migrate.phases import guard
from migrate.protocol import next_phase, path_of, step_number
from migrate.record import Migration
from migrate.store import DirectoryStore
from tests.migrator_fakes import Fakes, agg_doc, running_query

TOPICS = {"orders": 3, "orders_eu": 3, "totals": 2}


def setup(tmp_path: Path, new_doc: dict, name: str = "v3.json") -> tuple[DirectoryStore, str]:
    store = running_query(tmp_path / "st", agg_doc("q", "orders", "totals"))
    p = tmp_path / name
    p.write_text(json.dumps(new_doc))
    return store, str(p)


def counted(monkeypatch, **counts: int) -> None:
    """What the guard reads from the output and the side topic."""
    monkeypatch.setattr(guard, "comparison", lambda m, ctx: None)
    monkeypatch.setattr(guard, "count", lambda views: dict(counts))


def cli(*args: str):
    """The CLI in-process: ``stdout`` and ``stderr`` apart, ``output`` both."""
    r = CliRunner().invoke(main, list(args))
    assert "Traceback" not in r.output, r.output
    return r


# -- the preflight (step 1) -----------------------------------------------------------------

def test_a_missing_source_topic_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    store, new = setup(tmp_path, agg_doc("q", "orders_eu", "totals"))
    fakes = Fakes({"orders": 3, "totals": 2}).install(monkeypatch)
    lines: list[str] = []
    with pytest.raises(Refused) as e:
        migration.start(store, "q", new, bootstrap="fake:9", echo=lines.append, timeout=30)
    err = e.value
    assert (err.file, err.node, err.pointer) == (new, "orders", "/nodes/0/topic")
    assert err.exit_code == 6 and "'orders_eu', which does not exist" in err.message
    m = migration.current(store, "q")
    assert m.phase == "refused" and [h[0] for h in m.history] == ["check"]
    # nothing was written: no shadow, no gate, no topic, no control event
    assert fakes.spawned == fakes.created == fakes.control_events == []
    assert not (store.root / "gates").exists()
    assert lines == [f"[{m.id}] 1. check"]


def test_an_empty_source_topic_is_one_warning_line_naming_the_plan_file(tmp_path,
                                                                      monkeypatch):
    store, new = setup(tmp_path, agg_doc("q", "orders_eu", "totals"))
    Fakes(TOPICS, high={"orders": 40}).install(monkeypatch)  # orders_eu: nothing in it
    monkeypatch.setitem(runner.HANDLERS, "shadow", lambda m, ctx: None)
    m = Migration(id="m1", query="q", new_plan=new, old_instance="q", new_instance="q.g1",
                  plan_file=new, bootstrap="fake:9", reconcile="auto")
    lines: list[str] = []
    runner.step(m, Context(store, lines.append, 30))
    warnings = [ln for ln in lines if "warning" in ln]
    assert warnings == [f"theseus: warning: {new}: source 'orders' reads topic 'orders_eu', "
                        "which is empty: nothing of its history reaches the new plan"]
    assert m.phase == "shadow" and m.reconciling


# -- the delete guard (step 3) --------------------------------------------------------------

@pytest.mark.parametrize("deleted,keys,ratio,allow,refuses", [
    (30, 30, 0.1, False, True),   # issue 32's problem 3: every key
    (3, 30, 0.1, False, False),   # exactly the threshold passes
    (4, 30, 0.1, False, True),    # one more refuses
    (30, 30, 0.1, True, False),   # --allow-deletes
    (0, 0, 0.1, False, False),    # an empty output has nothing to delete
    (1, 1000, 0.0, False, True),  # --max-delete-ratio 0: no deletion at all
])
def test_the_guards_verdict(deleted, keys, ratio, allow, refuses):
    g = guard.verdict({"corrected": 0, "added": 0, "deleted": deleted, "matched": 0,
                       "keys": keys}, ratio, allow)
    assert g["refuses"] is refuses
    assert g["ratio"] == (round(deleted / keys, 4) if keys else 0.0)


def paused(tmp_path, monkeypatch, **kw) -> tuple[DirectoryStore, Migration, Fakes]:
    """A reconciling migration at the end of step 3: both queries capped at H."""
    store, new = setup(tmp_path, agg_doc("q", "orders_eu", "totals"))
    fakes = Fakes({**TOPICS, "totals.shadow": 1}).install(monkeypatch)
    m = Migration(id="m1", query="q", new_plan=new, plan_file=new, old_instance="q",
                  new_instance="q.g1", generation=1, kind="shadow", phase="pause",
                  reconciling=True, bootstrap="fake:9", high={"orders": {"0": 7}}, epoch=4,
                  **kw)
    m.save(store)
    for q in ("q", "q.g1"):
        write_gate(store.root, q, GateState("capped", {"orders": {0: 7}}, 4))
    store.set_status("q.g1", status="running", pid=0)
    return store, m, fakes


def test_the_guard_refuses_at_the_pause_and_rolls_it_back(tmp_path, monkeypatch):
    store, m, fakes = paused(tmp_path, monkeypatch)
    counted(monkeypatch, corrected=0, added=0, deleted=30, matched=0, keys=30)
    lines: list[str] = []
    with pytest.raises(Refused) as e:
        guard.DeleteGuard(m, Context(store, lines.append, 30)).judge(m.high)
    text = e.value.render()
    assert e.value.file == m.plan_file and "--allow-deletes" in text
    assert "30 of the output's 30 keys (100%) deleted: 0 corrected, 0 added, 30 deleted, " \
           "0 already right" in text
    saved = Migration.load(store, "m1")
    assert saved.phase == "refused" and saved.guard["refuses"] and saved.guard["keys"] == 30
    assert saved.error == text
    # the pause is lifted (a new epoch), the shadow goes, and with it its side topic
    assert read_gate(store.root, "q").mode == "open" and read_gate(store.root, "q").epoch > 4
    assert store.stop_requested("q.g1") and fakes.deleted == ["totals.shadow"]
    assert fakes.control_events == []
    assert lines[-1] == "[m1] refused"


@pytest.mark.parametrize("deleted", [30, 1])
def test_step_3_judges_once_both_queries_stand_at_h_and_before_the_cut(tmp_path, monkeypatch,
                                                                      deleted):
    """The real step 3 (its waits answered by the fakes): the guard reads ahead while the
    shadow keeps pace, judges once both queries acknowledged H, and only a migration it
    lets through goes on to step 4, the cut."""
    import os

    from migrate.phases import pause as pause_phase
    from migrate.services.arming import GateArming

    store, m, fakes = paused(tmp_path, monkeypatch)
    store.set_status("q.g1", status="running", pid=os.getpid())
    read: list[str] = []

    class Views:  # both topics, read whole the first time, then their tails
        def refresh(self):
            read.append("refresh")

    def count(views):
        views.refresh()
        return {"corrected": 30 - deleted, "added": 0, "deleted": deleted, "matched": 0,
                "keys": 30}

    monkeypatch.setattr(guard, "comparison", lambda m, ctx: read.append("views") or Views())
    monkeypatch.setattr(guard, "count", count)
    monkeypatch.setattr(GateArming, "acked", lambda self, q: fakes.offsets(["orders_eu"]))
    monkeypatch.setattr(pause_phase, "is_acked", lambda *a: True)  # both stand at H
    ctx = Context(store, lambda s: None, 30, steady_batches=1)
    if deleted == 30:
        with pytest.raises(Refused):
            runner.run(m, ctx)
        assert Migration.load(store, "m1").phase == "refused"
    else:
        with pytest.raises(AssertionError, match="a control event was written"):
            runner.run(m, ctx)  # the cut: the fakes' spy stops it there
        assert Migration.load(store, "m1").phase == "cut"
    # read ahead once while the shadow kept pace, the tails at H from the same views
    assert read == ["views", "refresh", "refresh"]
    assert m.guard["deleted"] == deleted and m.guard["at"] == m.high


def test_the_guard_lets_what_is_allowed_through_and_records_the_count(tmp_path, monkeypatch):
    store, m, _ = paused(tmp_path, monkeypatch, allow_deletes=True)
    counted(monkeypatch, corrected=0, added=0, deleted=30, matched=0, keys=30)
    lines: list[str] = []
    guard.DeleteGuard(m, Context(store, lines.append, 30)).judge(m.high)
    assert m.phase == "pause" and m.guard["deleted"] == 30 and not m.guard["refuses"]
    assert m.guard["at"] == {"orders": {"0": 7}}
    assert read_gate(store.root, "q").mode == "capped"  # still paused: the cut comes next
    assert lines == ["  the reconciliation at the cut: 30 of the output's 30 keys (100%) "
                     "deleted: 0 corrected, 0 added, 30 deleted, 0 already right "
                     "(--allow-deletes)"]


def test_the_guard_counts_as_the_sink_corrects(tmp_path, monkeypatch):
    """The guard's count and the hand-over's corrections come from the same comparison:
    the same topics read, the same counts; a tombstoned output key is not a live key."""
    import gates.reconcile as rec

    contents = {"out.shadow": {b"a": b'{"s":1,"c":1}', b"b": None, b"d": b'{"s":4}'},
                "out": {b"a": b'{"s":1}', b"b": b'{"s":2}', b"c": b'{"s":3}', b"e": None}}

    class FakeView:
        def __init__(self, bootstrap, topic, start, timeout):
            self.topic, self.latest, self.changed = topic, {}, set()

        def refresh(self):
            self.latest.update(contents[self.topic])
            self.changed = set(contents[self.topic])
            return self.latest

    monkeypatch.setattr(rec, "TopicView", FakeView)
    counts = guard.count(Comparison("b:9", "out.shadow", {}, "out"))
    assert counts == {"corrected": 1, "added": 1, "deleted": 2, "matched": 0, "keys": 3}
    _, at_cut = Reconciler(tmp_path, "q.g1", "b:9", "out").corrections(
        {"topic": "out.shadow", "from": {}, "migration": "m1"})
    assert {k: at_cut[k] for k in COUNTS} == {k: counts[k] for k in COUNTS}


# -- the dry run ----------------------------------------------------------------------------

def test_the_dry_run_path_has_its_own_numbers():
    assert path_of("shadow", dry_run=True) == ("check", "shadow", "preview", "previewed")
    assert [step_number("shadow", p, True) for p in path_of("", True)] == [1, 2, 3, 4]
    m = Migration(id="m1", query="q", new_plan="p", old_instance="q", dry_run=True,
                  kind="in_place", phase="check")
    assert next_phase(m) == "preview"  # no shadow for an in-place restart
    m.kind = "shadow"
    assert next_phase(m) == "shadow"
    m.phase = "shadow"
    assert next_phase(m) == "preview"


def dry_run(tmp_path, monkeypatch, new_doc: dict, *flags: str, previous: str = "",
            **counts: int):
    store, new = setup(tmp_path, new_doc)
    if previous:
        Migration(id=previous, query="q", new_plan=new, old_instance="q",
                  phase="done").save(store)
    fakes = Fakes(TOPICS, high={"orders": 40}).install(monkeypatch)
    counted(monkeypatch, **counts)
    r = cli("migrate", "start", new, "--bootstrap", "fake:9", "--state", str(store.root),
            "--dry-run", *flags)
    return store, new, fakes, r


def test_a_dry_run_reports_what_the_cutover_would_do_and_changes_nothing(tmp_path,
                                                                        monkeypatch):
    """Issue 32's problem 3, dry: the plan that reads an empty topic would delete every
    key; the dry run says so (exit 6) without a cap, a control event or a write."""
    store, new, fakes, r = dry_run(tmp_path, monkeypatch, agg_doc("q", "orders_eu", "totals"),
                                   "--format", "json", corrected=0, added=0, deleted=30,
                                   matched=0, keys=30)
    assert r.exit_code == 6, r.output
    report = json.loads(r.stdout)
    assert report["dry_run"] is True and report["plan"] == new and report["path"] == "shadow"
    assert report["reconciliation"] == {"corrected": 0, "added": 0, "deleted": 30,
                                        "matched": 0, "keys": 30}
    assert report["delete_guard"] == {"ratio": 1.0, "max_ratio": 0.1, "allow_deletes": False,
                                      "refuses": True}
    assert report["topics_created"] == ["totals.shadow"]
    assert report["control_events"] == {"count": 6, "topics": {"orders": 3, "orders_eu": 3}}
    assert report["head"] == {"orders_eu": {"0": 0, "1": 0, "2": 0}}
    assert report["warnings"] == [f"theseus: warning: {new}: source 'orders' reads topic "
                                  "'orders_eu', which is empty: nothing of its history "
                                  "reaches the new plan"]
    assert "the migration (dry run) would delete more than --max-delete-ratio 10%" in r.stderr
    # the phases went to stderr, numbered on the dry run's path
    steps = [ln.split("] ", 1)[1] for ln in r.stderr.splitlines() if ln.startswith("[m")]
    assert steps == ["1. check", "2. shadow", "3. preview", "4. previewed"]
    # nothing cut or written; the shadow ran and went, and so did the topic it created
    assert fakes.control_events == []
    assert fakes.spawned == ["q.g1"] and store.stop_requested("q.g1")
    assert fakes.created == fakes.deleted == ["totals.shadow"]
    assert not (store.root / "gates" / "q.json").exists()  # the old query never capped
    # the store: the dry run's record, and no current migration (as before it)
    rec = Migration.load(store, report["migration"])
    assert rec.dry_run and rec.phase == "previewed" and rec.plan_file == new
    assert not (store.query_dir("q") / "migration").exists()
    assert cli("migrate", "status", "q", "--state", str(store.root)).output == \
        "query 'q': no migration\n"


def test_a_dry_run_that_would_go_through_exits_0_and_restores_the_current_migration(
        tmp_path, monkeypatch):
    store, new, _, r = dry_run(tmp_path, monkeypatch,
                               agg_doc("q", "orders", "totals", filt="k <> 'k03'"),
                               "--require", "backfill", previous="m0", corrected=27,
                               added=2, deleted=1, matched=0, keys=30)
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "reconciliation at the cut (counted with the shadow at the head " in out
    assert "27 corrected, 2 added, 1 deleted, 0 already right, of the output's 30 keys" in out
    assert "delete guard: passes: 3% of the keys deleted, at most 10%" in out
    assert "control events it would write: 3, one into every partition of orders (3)" in out
    assert out.rstrip().endswith("the migration would go through; nothing was cut or written")
    assert migration.current(store, "q").id == "m0"  # as it found it


def test_a_dry_run_of_an_in_place_upgrade_starts_nothing(tmp_path, monkeypatch):
    store, new, fakes, r = dry_run(tmp_path, monkeypatch,
                                   agg_doc("q", "orders", "totals", filt="k <> 'k03'"))
    assert r.exit_code == 0, r.output
    assert "a restart in place on the checkpoint" in r.stdout
    assert "no shadow, no control event, no new topic" in r.stdout
    assert fakes.spawned == [] and fakes.created == []
    assert not store.stop_requested("q")


def test_a_dry_run_refused_at_step_1_leaves_no_current_migration_either(tmp_path,
                                                                         monkeypatch):
    store, new, fakes, r = dry_run(tmp_path, monkeypatch, agg_doc("q", "orders_us", "totals"),
                                   previous="m0")
    assert r.exit_code == 6 and "'orders_us', which does not exist" in r.output
    assert migration.current(store, "q").id == "m0" and fakes.spawned == []
    refused = [m for m in (store.root / "migrations").glob("m2*.json")
               if not m.name.endswith(".plan.json")]
    assert len(refused) == 1 and Migration.load(store, refused[0].stem).phase == "refused"


def test_dry_run_and_the_guard_take_one_plan(tmp_path):
    r = cli("migrate", "start", "a.json", "b.json", "--bootstrap", "x:9", "--dry-run",
            "--state", str(tmp_path / "st"))
    assert r.exit_code == 2 and "take one plan" in r.output


# -- the output topic theseus run creates ---------------------------------------------------

def test_the_output_topic_takes_the_partitions_of_the_first_sources_left_side():
    doc = agg_doc("q", "orders", "totals")
    doc["nodes"].insert(1, {"id": "refs", "step": "source", "version": 1, "topic": "refs",
                            "partitions": 7, "format": "json", "role": "table",
                            "key_columns": ["k"],
                            "schema": [{"name": "k", "type": "string"},
                                       {"name": "y", "type": "bigint"}]})
    doc["nodes"].insert(2, {"id": "j", "step": "join", "version": 1,
                            "inputs": ["orders", "refs"], "type": "inner",
                            "left_keys": ["k"], "right_keys": ["k"]})
    doc["nodes"][3]["inputs"] = ["j"]
    plan = from_doc(doc)
    assert plantopics.first_source(plan).id == "orders"
    assert plantopics.output_settings(plan)[:2] == (3, {"cleanup.policy": "compact"})
    doc["nodes"][2]["inputs"] = ["refs", "orders"]  # the table is the left side now
    doc["nodes"][2]["type"] = "inner"
    assert plantopics.first_source(from_doc(doc)).id == "refs"


def test_an_append_output_keeps_the_brokers_cleanup_policy():
    doc = agg_doc("q", "orders", "totals")
    doc["nodes"] = [doc["nodes"][0], {"id": "out", "step": "sink", "version": 1,
                                      "inputs": ["orders"], "topic": "copy", "format": "json",
                                      "key_columns": [], "mode": "append",
                                      "delivery": "exactly_once"}]
    partitions, config, why = plantopics.output_settings(from_doc(doc))
    assert (partitions, config) == (3, {})
    assert why.endswith("the broker's cleanup policy: an append output is a stream")
