"""Issue 32, problem 6 (exit codes a script cannot trust): the one table of exit codes
(:mod:`compat.exits`) is walked here.  Every situation it lists is brought about through the
CLI, in-process (the migrator's Kafka and query hosts are :mod:`tests.migrator_fakes`'s), and
must end with its row's code; a situation added to the table without a scenario here fails
the walk.  docs/exit-codes.md carries the same table, and ``theseus --help`` shows it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from compat import exits
from gates.lease import this_host
from migrate import migration
from migrate.cli import main
from migrate.phases import guard
from migrate.record import Migration
from migrate.runner import HANDLERS
from migrate.store import DirectoryStore
from tests.conftest import FIXTURES, ROOT
from tests.migrator_fakes import Fakes, agg_doc, running_query

UP = FIXTURES / "upgrades"
TOPICS = {"orders": 3, "orders_eu": 3, "totals": 2}


def cli(*args: str) -> int:
    r = CliRunner().invoke(main, list(args))
    assert "Traceback" not in r.output, r.output
    return r.exit_code


def store_of(tmp: Path, doc: dict | None = None) -> tuple[DirectoryStore, str]:
    doc = doc or agg_doc("q", "orders", "totals")
    return running_query(tmp / "st", doc), str(tmp / "st")


def plan_file(tmp: Path, doc: dict, name: str = "v2.json") -> str:
    p = tmp / name
    p.write_text(json.dumps(doc))
    return str(p)


def record(store: DirectoryStore, phase: str, **kw) -> Migration:
    kw.setdefault("new_plan", str(store.plan_path("q")))
    m = Migration(id="m1", query="q", old_instance="q", new_instance="q.g1", generation=1,
                  kind="shadow", phase=phase, bootstrap="127.0.0.1:9", **kw)
    m.save(store)
    return m


def on_store(phase: str | None, *args: str, **kw) -> Callable:
    """A scenario: the query runs (with a migration recorded in ``phase``), then the
    command ``args`` on its store."""
    def scenario(tmp: Path, mp) -> int:
        store, state = store_of(tmp)
        if phase is not None:
            record(store, phase, **kw)
        return cli(*args, "--state", state)

    return scenario


def start(tmp: Path, mp, doc: dict, *flags: str, fakes: Fakes | None = None) -> int:
    _, state = store_of(tmp)
    (fakes or Fakes(TOPICS)).install(mp)
    return cli("migrate", "start", plan_file(tmp, doc), "--bootstrap", "fake:9",
               "--state", state, *flags)


def counting(mp, deleted: int, keys: int = 30) -> None:
    """The reconciliation's count, as the guard reads it from both topics."""
    mp.setattr(guard, "comparison", lambda m, ctx: None)
    mp.setattr(guard, "count", lambda views: {"corrected": keys - deleted, "added": 0,
                                              "deleted": deleted, "matched": 0,
                                              "keys": keys})


# -- one scenario per situation of the table ------------------------------------------------

def check_identical(tmp, mp):
    return cli("check", str(UP / "identical_same_plan" / "old.json"),
               str(UP / "identical_same_plan" / "new.json"))


def start_done(tmp, mp):
    # the same plan again: an in-place restart on the checkpoint, by a host that obeys
    return start(tmp, mp, agg_doc("q", "orders", "totals"))


def dry_run_goes_through(tmp, mp):
    counting(mp, deleted=1)
    return start(tmp, mp, agg_doc("q", "orders", "totals", filt="k <> 'k03'"), "--dry-run",
                 "--require", "backfill")


def check_migrate(tmp, mp):
    return cli("check", str(UP / "group_by_key_changed" / "old.json"),
               str(UP / "group_by_key_changed" / "new.json"))


def check_invalid(tmp, mp):
    return cli("check", str(tmp / "nowhere.json"), str(UP / "identical_same_plan" / "new.json"))


def git_repo(tmp: Path, mp) -> Path:
    """A git repository holding one plan under plans/, committed; the working folder."""
    import shutil
    import subprocess

    repo = tmp / "repo"
    (repo / "plans").mkdir(parents=True)
    shutil.copy(UP / "identical_same_plan" / "old.json", repo / "plans" / "q.json")
    for args in (["init", "-q"], ["add", "."],
                 ["-c", "user.email=ci@example.com", "-c", "user.name=ci", "commit", "-qm",
                  "base"]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    mp.chdir(repo)
    return repo


def against_nothing(tmp, mp):
    git_repo(tmp, mp)
    return cli("check", "--against", "HEAD", "plans_typo")


def against_removed(tmp, mp):
    repo = git_repo(tmp, mp)
    (repo / "plans" / "q.json").unlink()
    return cli("check", "--against", "HEAD", "plans", "--allow-migration")


def fleet_of_nothing(tmp, mp):
    (tmp / "empty").mkdir()
    (tmp / "empty2").mkdir()
    show = cli("fleet", "show", str(tmp / "empty"))
    check = cli("fleet", "check", str(tmp / "empty"), str(tmp / "empty2"))
    return show if show != check else check


def start_contradicted(tmp, mp):
    return start(tmp, mp, agg_doc("q", "orders_eu", "totals"), "--strategy", "in-place")


def dry_run_of_a_cascade(tmp, mp):
    _, state = store_of(tmp)
    a = plan_file(tmp, agg_doc("q", "orders", "totals"), "a.json")
    b = plan_file(tmp, agg_doc("r", "totals", "more"), "b.json")
    return cli("migrate", "start", a, b, "--bootstrap", "fake:9", "--state", state,
               "--dry-run")


def check_unsupported(tmp, mp):
    return cli("check", str(UP / "sink_key_changed" / "old.json"),
               str(UP / "sink_key_changed" / "new.json"))


def start_unsupported(tmp, mp):
    case = UP / "sink_key_changed"  # the output's key changes: not live on the same output
    _, state = store_of(tmp, json.loads((case / "old.json").read_text()))
    Fakes({}).install(mp)  # refused before anything asks the cluster
    return cli("migrate", "start", str(case / "new.json"), "--bootstrap", "fake:9",
               "--state", state)


def run_failed(tmp, mp):
    import migrate.plantopics
    import migrate.run

    class Failed:  # a query Spark ended with an error
        id, isActive, recentProgress = "q-id", False, []

        def exception(self):
            return "org.apache.spark.SparkException: boom"

    mp.setattr("gates.broker.check_access", lambda *a, **kw: None)
    mp.setattr(migrate.plantopics, "prepare", lambda *a, **kw: None)
    mp.setattr(migrate.run, "start_query", lambda *a, **kw: Failed())
    return cli("run", plan_file(tmp, agg_doc("q", "orders", "totals")), "--bootstrap", "x:9",
               "--state", str(tmp / "st"))


def status_store_unusable(tmp, mp):
    (tmp / "file").write_text("not a folder")
    return cli("migrate", "status", "q", "--state", str(tmp / "file" / "st"))


def resume_step_fails(tmp, mp):
    store, state = store_of(tmp)
    record(store, "cut", high={"orders": {"0": 0}})  # step 4 asks a broker that is not there
    return cli("migrate", "resume", "q", "--state", state, "--timeout", "2")


def start_missing_source(tmp, mp):
    return start(tmp, mp, agg_doc("q", "orders_us", "totals"))


def start_delete_guard(tmp, mp):
    # step 3 counted at H: 30 of 30 keys deleted (the wrong topic of issue 32's problem 3)
    store, state = store_of(tmp)
    Fakes(TOPICS).install(mp)
    counting(mp, deleted=30)
    m = record(store, "pause", reconciling=True, new_plan=plan_file(
        tmp, agg_doc("q", "orders_eu", "totals")), high={"orders": {"0": 5}})
    mp.setitem(HANDLERS, "pause", lambda m, ctx: guard.DeleteGuard(m, ctx).judge(m.high))
    return cli("migrate", "resume", m.query, "--state", state)


def start_history_gone(tmp, mp):
    return start(tmp, mp, agg_doc("q", "orders_eu", "totals"),
                 fakes=Fakes(TOPICS, high={"orders_eu": 9}, low={"orders_eu": 4}))


def dry_run_refused(tmp, mp):
    counting(mp, deleted=30)
    return start(tmp, mp, agg_doc("q", "orders_eu", "totals"), "--dry-run")


def start_beside_another(tmp, mp):
    store, state = store_of(tmp)
    record(store, "shadow")
    return cli("migrate", "start", plan_file(tmp, agg_doc("q", "orders_eu", "totals")),
               "--bootstrap", "fake:9", "--state", state)


def run_missing_source(tmp, mp):
    mp.setattr("gates.broker.check_access", lambda *a, **kw: None)
    mp.setattr("migrate.plantopics.topics_of", lambda *a, **kw: {"totals": 2})
    return cli("run", plan_file(tmp, agg_doc("q", "orders", "totals")), "--bootstrap", "x:9",
               "--state", str(tmp / "st"))


def stop_stopped(tmp, mp):
    store, state = store_of(tmp)
    store.set_status("q", status="stopped")
    return cli("stop", "q", "--state", state)


def stop_obeyed(tmp, mp):
    import threading
    import time

    store, state = store_of(tmp)
    store.set_status("q", host=this_host())

    def host() -> None:  # the query's host: stops after its batch once asked
        while not store.stop_requested("q"):
            time.sleep(0.05)
        store.set_status("q", status="stopped", last_batch=7)

    threading.Thread(target=host, daemon=True).start()
    return cli("stop", "q", "--state", state, "--timeout", "30")


def stop_ignored(tmp, mp):
    store, state = store_of(tmp)
    store.set_status("q", host=this_host())  # this process: alive, and it never stops
    return cli("stop", "q", "--state", state, "--timeout", "0.5")


def start_interrupted(tmp, mp):
    def interrupted(*a, **kw):
        raise KeyboardInterrupt

    mp.setattr(migration, "start", interrupted)
    return start(tmp, mp, agg_doc("q", "orders_eu", "totals"))


def prove_with(rt_kw: dict, case: str, *args: str) -> Callable:
    """``theseus prove`` on a fixture pair, Spark replaced by tests.test_prove's fakes."""
    def scenario(tmp: Path, mp) -> int:
        from migrate import prove
        from tests.test_prove import FakeRuntime, FakeSparkRuntime

        fakes = {"theseus": FakeRuntime, "spark": FakeSparkRuntime}
        mp.setattr(prove, "runtime", lambda bootstrap, name="theseus": fakes[name](**rt_kw))
        return cli("prove", str(UP / case / "old.json"), str(UP / case / "new.json"),
                   "--bootstrap", "fake:9", *args)

    return scenario


SCENARIOS: dict[str, Callable] = {
    "prove: Spark agrees with the verdict and the predicted restart":
        prove_with({}, "filter_changed_before_aggregate"),
    "prove: an in_place verdict whose restart breaks its promise":
        prove_with({"keep_old_filter": True}, "filter_changed_stream"),
    "prove: a restart whose generated input leaves no output to compare (a vacuous proof)":
        prove_with({"write_nothing": True}, "filter_changed_stream"),
    "prove: a plan whose input prove cannot generate (a recursive step), or a "
    "nondeterministic new plan":
        prove_with({}, "recursive_body_changed"),
    "prove --runtime spark: a plan no PySpark job can say (a top-N)":
        prove_with({}, "top_n_n_decreased", "--runtime", "spark"),
    "check: the verdict is identical or in_place": check_identical,
    "migrate start: the migration is done": start_done,
    "migrate start --dry-run: the migration would go through": dry_run_goes_through,
    "migrate status: the query has no migration (it says so)":
        on_store(None, "migrate", "status", "q"),
    "migrate abort: the migration is aborted, or had already ended aborted":
        on_store("aborted", "migrate", "abort", "q"),
    "status: the store's queries are listed (none: it says so)": on_store("shadow", "status"),
    "migrate history: the query's past migrations are listed (none: it says so)":
        on_store(None, "migrate", "history", "q"),
    "status: no store at --state": lambda tmp, mp: cli("status", "--state", str(tmp / "no")),
    "migrate rollback: a migration of the query runs, or no plan before it was kept":
        on_store(None, "migrate", "rollback", "q"),
    "stop: the query stopped after its batch": stop_obeyed,
    "stop: the query's host is still running after --timeout": stop_ignored,
    "check: the verdict is migrate": check_migrate,
    "check: a plan that cannot be read or is invalid": check_invalid,
    "check --against: a path in neither the work tree nor REF, or one that holds no plan":
        against_nothing,
    "fleet show: a folder that holds no plan; fleet check: no plan on either side":
        fleet_of_nothing,
    "check --against: a plan was removed (its query must be stopped by hand; also with "
    "--allow-migration)": against_removed,
    "migrate status: a query the store does not know":
        on_store(None, "migrate", "status", "nobody"),
    "migrate start: flags the upgrade contradicts (--strategy in-place for a migrate "
    "verdict)": start_contradicted,
    "migrate start: --dry-run with several plans": dry_run_of_a_cascade,
    "check: the verdict is unsupported": check_unsupported,
    "migrate start: the checker says unsupported": start_unsupported,
    "run: the query failed": run_failed,
    "migrate status: the store cannot be opened": status_store_unusable,
    "migrate resume: a step fails (a broker that does not answer within --timeout)":
        resume_step_fails,
    "migrate start: a source topic of the new plan does not exist": start_missing_source,
    "migrate start, resume: at the pause, the reconciliation would delete more than "
    "--max-delete-ratio of the output's keys (without --allow-deletes)": start_delete_guard,
    "migrate start: retention has deleted history the new stateful plan needs":
        start_history_gone,
    "migrate start --dry-run: the migration would be refused by the delete guard":
        dry_run_refused,
    "migrate start: another migration of the query is in progress": start_beside_another,
    "migrate resume: the query has no migration": on_store(None, "migrate", "resume", "q"),
    "migrate resume: the migration has ended (done, aborted or refused)":
        on_store("refused", "migrate", "resume", "q", error="refused at step 3"),
    "migrate abort: the query has no migration": on_store(None, "migrate", "abort", "q"),
    "migrate abort: the migration is past its point of no return (resume finishes it)":
        on_store("done", "migrate", "abort", "q"),
    "run: a source topic does not exist, or the output topic cannot be created":
        run_missing_source,
    "stop: the query is not running": stop_stopped,
    "migrate start: interrupted": start_interrupted,
}

ROWS = [(e.code, case) for e in exits.EXITS for case in e.cases]


def test_every_situation_of_the_table_has_a_scenario_and_nothing_else():
    assert set(SCENARIOS) == {case for _, case in ROWS}
    assert len(ROWS) == len({case for _, case in ROWS})  # one code per situation


@pytest.mark.parametrize("code,case", ROWS, ids=[f"{c}-{s[:50]}" for c, s in ROWS])
def test_each_situation_ends_with_its_code(tmp_path, monkeypatch, code, case):
    monkeypatch.chdir(tmp_path)  # a crash file, if any, lands here
    assert SCENARIOS[case](tmp_path, monkeypatch) == code


def test_the_docs_carry_the_table_and_the_help_shows_it():
    page = (ROOT / "docs" / "exit-codes.md").read_text(encoding="utf-8")
    assert exits.markdown() in page, "docs/exit-codes.md's exit code table drifted: paste " \
        "compat.exits.markdown()"
    r = CliRunner().invoke(main, ["--help"])
    assert r.exit_code == 0
    for e in exits.EXITS:
        assert f"  {e.code:<4} {e.meaning}\n" in r.output, e.code
        assert all(case in r.output for case in e.cases), e.code


# -- what the codes say beyond the number ---------------------------------------------------

def test_a_refusal_names_the_users_plan_file_never_the_stores_copy(tmp_path, monkeypatch):
    """Issue 32: "A refusal names the internal copy of the plan
    (migrations/m…-f24959.plan.json), not the user's file"."""
    store, state = store_of(tmp_path)
    Fakes(TOPICS).install(monkeypatch)
    user = plan_file(tmp_path, agg_doc("q", "orders_us", "totals"), "v3.json")
    r = CliRunner().invoke(main, ["migrate", "start", user, "--bootstrap", "fake:9",
                                  "--state", state])
    assert r.exit_code == 6, r.output
    line = r.output.strip().splitlines()[-1]
    assert line.startswith(f"theseus: error: {user}, node 'orders', at /nodes/0/topic: ")
    assert "'orders_us', which does not exist" in line and ".plan.json" not in line
    m = migration.current(store, "q")
    assert m.phase == "refused" and m.plan_file == user and user in m.error
    # and the refusal stays a refusal: resume does not read "resumed" into it
    r = CliRunner().invoke(main, ["migrate", "resume", "q", "--state", state])
    assert r.exit_code == 6 and "is refused: nothing to resume" in r.output
    assert "v3.json" in r.output


def test_migrate_status_with_no_migration_says_so_in_text_and_json(tmp_path):
    _, state = store_of(tmp_path)
    r = CliRunner().invoke(main, ["migrate", "status", "q", "--state", state])
    assert (r.exit_code, r.output) == (0, "query 'q': no migration\n")
    r = CliRunner().invoke(main, ["migrate", "status", "q", "--state", state, "--format",
                                  "json"])
    assert r.exit_code == 0 and json.loads(r.output) is None


def test_stop_of_a_query_whose_process_is_gone_says_so(tmp_path):
    store, state = store_of(tmp_path)
    store.set_status("q", status="running", pid=2 ** 22 + 12345)  # no such process
    r = CliRunner().invoke(main, ["stop", "q", "--state", state])
    assert r.exit_code == 6 and "is not running" in r.output and "is gone" in r.output
    assert not store.stop_requested("q")


def test_a_run_on_a_missing_output_topic_creates_it_as_the_plan_says(tmp_path, monkeypatch):
    """``theseus run``: the output topic is created before Spark starts, with the first
    source's partitions and compacted (a keyed update output); one line says so."""
    import migrate.plantopics as pt
    import migrate.run

    made = []

    class Started(Exception):
        pass

    def start_query(*a, **kw):
        raise Started

    monkeypatch.setattr("gates.broker.check_access", lambda *a, **kw: None)
    monkeypatch.setattr(pt, "topics_of", lambda *a, **kw: {"orders": 3})
    monkeypatch.setattr(pt, "create_topic", lambda b, t, n, conf, d: made.append((t, n, conf)))
    monkeypatch.setattr(migrate.run, "start_query", start_query)
    lines: list[str] = []
    with pytest.raises(Started):
        migrate.run.run(plan_file(tmp_path, agg_doc("q", "orders", "totals")),
                        bootstrap="x:9", state=str(tmp_path / "st"), echo=lines.append)
    assert made == [("totals", 3, {"cleanup.policy": "compact"})]
    assert lines[0] == ("theseus: created the output topic 'totals': 3 partition(s) as "
                        "source 'orders' declares, compacted: a keyed update output is a "
                        "table")


def test_a_run_whose_output_topic_cannot_be_created_is_refused_before_spark(tmp_path,
                                                                          monkeypatch):
    import migrate.plantopics as pt
    import migrate.run
    from compat.errors import BrokerError

    def refused(*a, **kw):
        raise BrokerError("cannot create the topic: Authorization failed", topic="totals",
                          expected="a topic", found="TOPIC_AUTHORIZATION_FAILED")

    monkeypatch.setattr("gates.broker.check_access", lambda *a, **kw: None)
    monkeypatch.setattr(pt, "topics_of", lambda *a, **kw: {"orders": 3})
    monkeypatch.setattr(pt, "create_topic", refused)
    monkeypatch.setattr(migrate.run, "start_query", lambda *a, **kw: pytest.fail("started"))
    p = plan_file(tmp_path, agg_doc("q", "orders", "totals"))
    r = CliRunner().invoke(main, ["run", p, "--bootstrap", "x:9", "--state",
                                  str(tmp_path / "st")])
    assert r.exit_code == 6, r.output
    errs = [ln for ln in r.output.splitlines() if ln.startswith("theseus: error:")]
    assert len(errs) == 1 and "output topic 'totals' does not exist and cannot be" in errs[0]
    assert "kafka-topics --bootstrap-server x:9 --create --topic totals --partitions 3 " \
           "--config cleanup.policy=compact" in errs[0]
    assert not (tmp_path / "st" / "queries" / "q").exists()  # nothing recorded either


def test_the_store_keeps_no_plan_for_a_refused_run(tmp_path, monkeypatch):
    """A missing source topic refuses ``theseus run`` before it records anything."""
    assert run_missing_source(tmp_path, monkeypatch) == 6
    assert not (tmp_path / "st").exists()
