"""Issue 32, item 4: an operator's view of a store — `theseus status`, `migrate status`
(text and JSON), `migrate history` and `migrate rollback`'s refusals, over store
directories built here (the real thing on Kafka and Spark: tests/integration/test_view.py)."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest
from click.testing import CliRunner

from compat.check import load_plan
from compat.schema_check import load_schema
from compat.serde import dumps
from migrate import view
from migrate.cli import main
from migrate.record import Migration, new_migration, user_file
from migrate.store import DirectoryStore

HERE = socket.gethostname()
NOW = 1_750_000_000.0
STATUS_SCHEMA = load_schema("status.v1.json")


def plan_doc(query: str, tag: str, src: str = "in", out: str = "out") -> dict:
    return {
        "format": "theseus.plan/1", "query": query, "config": {"state_partitions": 2},
        "nodes": [
            {"id": "events", "step": "source", "version": 1, "topic": src, "partitions": 2,
             "format": "json", "role": "stream",
             "schema": [{"name": "id", "type": "bigint"}, {"name": "v", "type": "string"}]},
            {"id": "shape", "step": "project", "version": 1, "inputs": ["events"],
             "columns": [{"name": "id", "expr": "id"}, {"name": "tag", "expr": f"'{tag}'"}]},
            {"id": "out", "step": "sink", "version": 1, "inputs": ["shape"], "topic": out,
             "format": "json", "key_columns": [], "mode": "append",
             "delivery": "exactly_once"}]}


def put_query(store: DirectoryStore, tmp_path: Path, instance: str, doc: dict,
              **status) -> Path:
    """A query host as `theseus run` records it (the user's file written beside)."""
    user = tmp_path / f"{instance}.json"
    user.write_text(json.dumps(doc))
    store.put_plan(instance, dumps(load_plan(str(user))))
    status.setdefault("plan_file", str(user))
    status.setdefault("plan_query", doc["query"])
    store.set_status(instance, **status)
    return user


def put_ack(store: DirectoryStore, instance: str, offsets: dict[int, int], at: float,
            topic: str = "in") -> None:
    path = store.root / "gates" / f"{instance}.ack.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"query": instance, "topics": {topic: {
        "offsets": {str(p): o for p, o in offsets.items()}, "mode": "open", "epoch": 0,
        "at_cap": False, "time": at}}}))


@pytest.fixture
def store(tmp_path) -> DirectoryStore:
    """Four queries: `alpha` alive here and migrating (its shadow backfilling), `beta`
    stopped, `gamma` on another host with a fresh heartbeat, `delta` there with a stale one."""
    s = DirectoryStore(tmp_path / "state")
    pid = os.getpid()
    put_query(s, tmp_path, "alpha", plan_doc("alpha", "v1"), status="running", pid=pid,
              host=HERE, bootstrap="broker:9092", last_batch=41, heartbeat_at=NOW - 1,
              heartbeat_every=5.0)
    put_ack(s, "alpha", {0: 600, 1: 390}, NOW - 2)
    put_query(s, tmp_path, "beta", plan_doc("beta", "v1", "in_b", "out_b"), status="stopped",
              pid=999_999_999, host=HERE, bootstrap="broker:9092", last_batch=7)
    put_query(s, tmp_path, "gamma", plan_doc("gamma", "v1", "in_g", "out_g"),
              status="running", pid=12, host="elsewhere", bootstrap="broker:9092",
              heartbeat_at=NOW - 4, heartbeat_every=5.0)
    put_query(s, tmp_path, "delta", plan_doc("delta", "v1", "in_d", "out_d"),
              status="running", pid=13, host="elsewhere", bootstrap="broker:9092",
              heartbeat_at=NOW - 60, heartbeat_every=5.0)
    # alpha's migration: its shadow alpha.g1 runs the new plan, 400 of 1,000 read
    new = put_query(s, tmp_path, "alpha.g1", plan_doc("alpha", "v2"), status="running",
                    pid=pid, host=HERE, bootstrap="broker:9092")
    put_ack(s, "alpha.g1", {0: 250, 1: 150}, NOW - 1)
    m = Migration(id="m20250615120000-abc123", query="alpha", new_plan=str(new),
                  old_instance="alpha", new_instance="alpha.g1", kind="shadow",
                  phase="shadow", verdict="migrate", bootstrap="broker:9092",
                  history=[["check", NOW - 30], ["shadow", NOW - 20]],
                  backfill={"from": {"in": {"0": 0, "1": 0}},
                            "to": {"in": {"0": 500, "1": 500}}},
                  plan_file="/home/op/v2.json")
    m.save(s)
    return s


@pytest.fixture
def heads(monkeypatch):
    """The broker's high watermarks, asked once per topic (a broker without Kafka)."""
    asked = []

    def watermarks(bootstrap, topics, deadline):
        asked.append((bootstrap, tuple(topics)))
        return {t: {0: 700, 1: 400} for t in topics}

    monkeypatch.setattr(view, "watermarks", watermarks)
    return asked


def test_status_lists_every_query_with_liveness_lag_and_its_migration(store, heads):
    doc = view.snapshot(store, view.Heads(), now=NOW)
    jsonschema.validate(doc, STATUS_SCHEMA)
    by = {q["query"]: q for q in doc["queries"]}
    assert list(by) == ["alpha", "beta", "delta", "gamma"]  # alpha.g1 is an instance
    a = by["alpha"]
    assert (a["alive"], a["lag"], a["last_batch"]) == (True, 110, {"id": 41, "at": NOW - 2})
    assert a["plan"]["file"].endswith("alpha.json")
    assert a["plan"]["digest"] == view.digest(store.plan_path("alpha"))
    assert a["plan"]["digest"] != view.digest(store.plan_path("alpha.g1"))
    mv = a["migration"]
    assert (mv["phase"], mv["step"], mv["owner"]) == ("shadow", 2, None)
    assert mv["shadow"]["alive"] is True and mv["shadow"]["lag"] == 700
    assert mv["progress"] == {"read": 400, "total": 1000, "arrived": 200, "fraction": 0.4}
    assert (by["beta"]["alive"], by["beta"]["lag"]) == (False, None)
    assert by["gamma"]["alive"] is True and "heartbeat 4 s ago" in by["gamma"]["liveness"]
    assert by["delta"]["alive"] is False and "heartbeat 60 s ago" in by["delta"]["liveness"]
    # the broker was asked once for the whole look (alpha and its shadow read one topic),
    # never for a query that does not run or has acknowledged nothing yet
    assert heads == [("broker:9092", ("in",))]


def test_status_text(store, heads, tmp_path):
    text = view.render_text(view.snapshot(store, view.Heads(), now=NOW))
    d = view.digest
    assert text.splitlines() == [
        f"store {store.root}: 4 queries, 1 migrating",
        "",
        f"alpha: running, alive (pid {os.getpid()} on this host)",
        f"  plan {tmp_path / 'alpha.json'}  {d(store.plan_path('alpha'))}",
        "  last batch 41, input committed 2 s ago, lag 110 records",
        "  migration m20250615120000-abc123: 2. shadow (shadow, verdict migrate), "
        "owner unknown",
        f"    shadow alpha.g1: alive (pid {os.getpid()} on this host)",
        "    backfill [##########..............]  40%  400/1,000 records  +200 since",
        "",
        "beta: stopped, not alive",
        f"  plan {tmp_path / 'beta.json'}  {d(store.plan_path('beta'))}",
        "  last batch 7, not running",
        "",
        "delta: running, not alive (pid 13 on elsewhere, heartbeat 60 s ago (more than "
        "3 beats of 5 s))",
        f"  plan {tmp_path / 'delta.json'}  {d(store.plan_path('delta'))}",
        "  no batch yet, not running",
        "",
        "gamma: running, alive (pid 12 on elsewhere, heartbeat 4 s ago)",
        f"  plan {tmp_path / 'gamma.json'}  {d(store.plan_path('gamma'))}",
        "  no batch yet, lag unknown (no batch acknowledged yet)"]


def test_without_a_broker_the_lag_is_unknown_and_says_why(store):
    doc = view.snapshot(store, view.Heads(timeout=0.5, bootstrap="127.0.0.1:1"), now=NOW)
    a = next(q for q in doc["queries"] if q["query"] == "alpha")
    assert a["lag"] is None and a["lag_note"].startswith("the broker at 127.0.0.1:1 did "
                                                         "not answer")
    # the backfill still shows, from the acknowledgements, without what arrived since
    assert a["migration"]["progress"] == {"read": 400, "total": 1000, "arrived": None,
                                          "fraction": 0.4}


def test_a_host_elsewhere_without_a_heartbeat_is_unknown_and_its_lag_still_shown(
        tmp_path, heads):
    s = DirectoryStore(tmp_path / "state")
    put_query(s, tmp_path, "eps", plan_doc("eps", "v1"), status="running", pid=5,
              host="elsewhere", bootstrap="broker:9092")
    put_ack(s, "eps", {0: 690, 1: 400}, NOW - 3)
    text = view.render_text(view.snapshot(s, view.Heads(), now=NOW))
    assert text.splitlines()[2:] == [
        "eps: running, liveness unknown (pid 5 on elsewhere: no heartbeat recorded)",
        f"  plan {tmp_path / 'eps.json'}  {view.digest(s.plan_path('eps'))}",
        "  last batch, input committed 3 s ago, lag 10 records"]


def test_a_dead_pid_on_this_host_is_not_alive_whatever_its_status_says():
    alive, how = view.liveness({"status": "running", "pid": 999_999_999, "host": HERE})
    assert alive is False and "is gone (running recorded)" in how
    assert view.liveness({"status": "running", "pid": 5, "host": "other"}) == \
        (None, "pid 5 on other: no heartbeat recorded")
    assert view.liveness({}) == (None, "no status recorded")


def test_the_owner_comes_from_owner_of(store, heads, monkeypatch):
    monkeypatch.setattr(view, "owner_of", lambda s, m: {
        "host": "ops-1", "pid": 4242, "epoch": 3, "heartbeat_at": NOW - 5})
    text = view.render_text(view.snapshot(store, view.Heads(), now=NOW))
    assert "2. shadow (shadow, verdict migrate), owner pid 4242 on ops-1, epoch 3, " \
        "heartbeat 5 s ago" in text


def test_status_cli_json_and_a_store_that_is_not_there(store, tmp_path):
    r = CliRunner().invoke(main, ["status", "--state", str(store.root), "--format", "json",
                                  "--bootstrap", "127.0.0.1:1", "--timeout", "0.5"])
    assert r.exit_code == 0, r.output
    jsonschema.validate(json.loads(r.output), STATUS_SCHEMA)
    missing = tmp_path / "nowhere"
    r = CliRunner().invoke(main, ["status", "--state", str(missing)])
    assert r.exit_code == 2
    assert r.output == (f"theseus: error: {missing}: no store here (expected a store "
                        "directory written by theseus run (--state), found no such "
                        "directory)\n")
    assert not missing.exists()  # looked at, not created
    empty = tmp_path / "empty"
    empty.mkdir()
    r = CliRunner().invoke(main, ["status", "--state", str(empty)])
    assert (r.exit_code, r.output) == (0, f"store {empty}: no queries\n")


def test_the_owner_is_the_holder_of_the_querys_lease_and_goes_stale_with_it(store):
    """owner_of reads the lease migrate start/resume take (migrate.lease): the holder while
    it holds; once released (or its holder gone) it is shown stale, with why."""
    from migrate.lease import Lease

    m = Migration.load(store, "m20250615120000-abc123")
    assert view.owner_of(store, m) is None  # nobody took it (an older Theseus)
    lease = Lease.take(store, ["alpha"], m.id, what="theseus migrate start", ttl=30,
                       command="theseus migrate start v2.json")
    owner = view.owner_of(store, m)
    assert (owner["pid"], owner["host"], owner["epoch"], owner["stale"]) == (
        os.getpid(), HERE, 1, None)
    assert owner["command"] == "theseus migrate start v2.json"
    text = view.owner_text(owner, owner["heartbeat_at"] + 3)
    assert text == f"owner pid {os.getpid()} on {HERE}, epoch 1, heartbeat 3 s ago"
    lease.release()
    owner = view.owner_of(store, m)
    assert owner["stale"] and owner["stale"].startswith("released by pid")
    assert "(stale: released by pid" in view.owner_text(owner, owner["heartbeat_at"])
    other = Migration(**{**m.__dict__, "id": "m-other"})
    assert view.owner_of(store, other) is None  # the lease names another migration


def test_migrate_status_adds_owner_liveness_and_backfill(store, heads):
    r = CliRunner().invoke(main, ["migrate", "status", "alpha", "--state", str(store.root)])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[:2] == ["migration m20250615120000-abc123 of 'alpha': phase shadow "
                         "(shadow, verdict migrate)", "  old alpha -> new alpha.g1"]
    assert lines[2:5] == ["  owner unknown",
                          f"  old alpha: alive (pid {os.getpid()} on this host), lag 110 "
                          "records",
                          f"  new alpha.g1: alive (pid {os.getpid()} on this host), lag "
                          "700 records"]
    assert lines[5].startswith("  backfill [##########..............]  40%  400/1,000")
    r = CliRunner().invoke(main, ["migrate", "status", "alpha", "--state", str(store.root),
                                  "--format", "json"])
    doc = json.loads(r.output)
    jsonschema.validate(doc, STATUS_SCHEMA)
    jsonschema.validate(doc["record"], load_schema("migration.v1.json"))
    assert [p["phase"] for p in doc["phases"]] == ["check", "shadow"]
    assert (doc["old"]["lag"], doc["new"]["alive"]) == (110, True)
    assert doc["progress"]["fraction"] == 0.4


def test_a_migration_keeps_the_plan_before_and_names_the_users_files(store, tmp_path):
    """The store keeps one plan per query, which a migration's finish overwrites: a new
    migration keeps a copy of the plan before (what a rollback goes back to)."""
    v3 = tmp_path / "v3.json"
    v3.write_text(json.dumps(plan_doc("beta", "v3", "in_b", "out_b")))
    before = store.plan_path("beta").read_text()
    m = new_migration(store, "beta", str(v3), bootstrap="b:1")
    assert Path(m.old_plan).read_text() == before and m.old_plan.endswith(".old.plan.json")
    assert (m.plan_file, m.old_plan_file) == (str(v3), str(tmp_path / "beta.json"))
    # a host the migrator started runs the store's copy: its user's file is the migration's
    m.save(store)
    store.set_status("beta.g1", plan_file=m.new_plan, plan_query="beta")
    assert user_file(store, "beta.g1") == str(v3)


# -- history and rollback -----------------------------------------------------------------

def past(store: DirectoryStore, tmp_path: Path, mid: str, phase: str, at: float,
         **kw) -> Migration:
    old = tmp_path / f"{mid}.old.json"
    old.write_text(dumps(load_plan(str(tmp_path / "beta.json"))))
    m = Migration(id=mid, query="beta", new_plan=str(tmp_path / f"{mid}.plan.json"),
                  old_instance="beta", new_instance="beta.g1", kind="shadow", phase=phase,
                  verdict="migrate", history=[["check", at], ["shadow", at + 2],
                                              [phase, at + 31]],
                  old_plan=str(old), old_plan_file="/home/op/v1.json",
                  plan_file="/home/op/v2.json", **kw)
    m.save(store)
    return m


def test_history_lists_past_migrations_with_outcome_cut_and_counts(store, tmp_path):
    past(store, tmp_path, "m20250615100000-aaaaaa", "refused", NOW - 7200,
         error="the checker says this upgrade is unsupported")
    past(store, tmp_path, "m20250615110000-bbbbbb", "aborted", NOW - 3600)
    past(store, tmp_path, "m20250615120000-cccccc", "done", NOW - 600,
         cut={"in_b": {"0": 971, "1": 2412}},
         counts={"corrected": 3, "added": 1, "deleted": 30, "matched": 2})
    r = CliRunner().invoke(main, ["migrate", "history", "beta", "--state", str(store.root)])
    assert r.exit_code == 0, r.output
    assert r.output.splitlines() == [
        "migrations of 'beta', oldest first:",
        "",
        "m20250615100000-aaaaaa  refused  started 2025-06-15 13:06:40Z, 31 s",
        "  verdict migrate, shadow",
        "  plan /home/op/v1.json -> /home/op/v2.json",
        "  why: the checker says this upgrade is unsupported",
        "",
        "m20250615110000-bbbbbb  aborted  started 2025-06-15 14:06:40Z, 31 s",
        "  verdict migrate, shadow",
        "  plan /home/op/v1.json -> /home/op/v2.json",
        "",
        "m20250615120000-cccccc  done  started 2025-06-15 14:56:40Z, 31 s",
        "  verdict migrate, shadow",
        "  plan /home/op/v1.json -> /home/op/v2.json",
        "  cut in_b 0:971 1:2412",
        "  reconciled 3 corrected, 1 added, 30 deleted, 2 already right"]
    r = CliRunner().invoke(main, ["migrate", "history", "beta", "--state", str(store.root),
                                  "--format", "json"])
    doc = json.loads(r.output)
    jsonschema.validate(doc, STATUS_SCHEMA)
    assert [e["outcome"] for e in doc["migrations"]] == ["refused", "aborted", "done"]
    r = CliRunner().invoke(main, ["migrate", "history", "gamma", "--state", str(store.root)])
    assert (r.exit_code, r.output) == (0, "no migrations of 'gamma'\n")
    r = CliRunner().invoke(main, ["migrate", "history", "nope", "--state", str(store.root)])
    assert r.exit_code == 2 and "no query named 'nope' in the store" in r.output


def rollback(store: DirectoryStore, query: str):
    return CliRunner().invoke(main, ["migrate", "rollback", query, "--state",
                                     str(store.root), "--bootstrap", "unused:1"])


def test_rollback_refuses_with_nothing_to_go_back_to_or_a_migration_running(store,
                                                                             tmp_path):
    r = rollback(store, "alpha")  # its migration is in phase shadow
    assert r.exit_code == 6, r.output
    assert "migration m20250615120000-abc123 of 'alpha' is running (phase shadow): a " \
        "rollback would be a second migration beside it" in r.output
    r = rollback(store, "gamma")
    assert r.exit_code == 6 and "'gamma' has no previous plan: none of its migrations " \
        "is done" in r.output
    r = rollback(store, "nope")
    assert r.exit_code == 2 and "no query named 'nope'" in r.output
    m = past(store, tmp_path, "m20250615120000-cccccc", "done", NOW - 600)
    Path(m.old_plan).unlink()
    r = rollback(store, "beta")
    assert r.exit_code == 6 and "was not kept (a migration of an earlier theseus)" in r.output
    m = past(store, tmp_path, "m20250615120000-cccccc", "done", NOW - 600, cascade="c1")
    r = rollback(store, "beta")
    assert r.exit_code == 6 and "was part of cascade c1" in r.output
    past(store, tmp_path, "m20250615120000-cccccc", "done", NOW - 600)
    r = rollback(store, "beta")  # beta runs what it ran before: nothing to go back to
    assert r.exit_code == 6 and "'beta' already runs the plan it ran before migration " \
        "m20250615120000-cccccc" in r.output
    assert not list((store.root / "migrations").glob("*.old.plan.json"))  # nothing began


def test_rollback_starts_a_migration_to_the_plan_before(store, tmp_path, monkeypatch):
    """The same `start` path, with the kept copy of the plan before as the new plan."""
    from migrate import runner

    last = past(store, tmp_path, "m20250615120000-cccccc", "done", NOW - 600,
                bootstrap="b:9", trigger="500 milliseconds")
    store.put_plan("beta", dumps(load_plan(str(tmp_path / "alpha.g1.json"))))  # "v2" runs
    ran = {}

    def run(m, ctx):
        ran["m"] = m
        m.phase, m.kind = "done", "shadow"
        return m

    monkeypatch.setattr(runner, "run", run)
    r = rollback(store, "beta")
    assert r.exit_code == 0, r.output
    m = ran["m"]
    assert r.output.splitlines() == [
        f"theseus: rolling 'beta' back to the plan before migration {last.id} "
        f"(/home/op/v1.json, {view.digest(Path(last.old_plan))})",
        f"theseus: migration {m.id} done: 'beta' runs the plan it ran before migration "
        f"{last.id} again (shadow)"]
    assert Path(m.new_plan).read_text() == Path(last.old_plan).read_text()
    assert (m.rollback_of, m.plan_file, m.bootstrap, m.trigger) == (
        last.id, "/home/op/v1.json", "unused:1", "500 milliseconds")
    assert Migration.load(store, m.id).rollback_of == last.id


def test_time_is_shown_in_utc():
    from migrate.history import when

    assert when(0.0) == "1970-01-01 00:00:00Z" and when(None) == "-"
    assert time.gmtime(NOW).tm_hour == 15  # the history test's times above


# -- theseus serve ----------------------------------------------------------------------

@pytest.fixture
def served(store, heads, monkeypatch):
    """`theseus serve` over the store, on a free port; counts the pages it served."""
    import threading

    from migrate import serve

    looks = []
    real = serve.look

    def look(*args):
        looks.append(time.monotonic())
        return real(*args)

    monkeypatch.setattr(serve, "look", look)
    # the store's times are NOW's: so is the view's clock
    monkeypatch.setattr(view, "time", SimpleNamespace(time=lambda: NOW))
    server = serve.make_server(store, 0, refresh=1.0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server, looks
    server.shutdown()
    server.server_close()


def test_serve_answers_reads_only_on_loopback(served):
    import urllib.error
    import urllib.request

    server, _ = served
    host, port = server.server_address[:2]
    assert host == "127.0.0.1"
    base = f"http://127.0.0.1:{port}"
    with urllib.request.urlopen(base + "/") as r:
        page = r.read().decode()
        assert r.headers["Content-Type"] == "text/html; charset=utf-8"
    assert '<meta http-equiv="refresh" content="1">' in page
    with urllib.request.urlopen(base + "/status.json") as r:
        jsonschema.validate(json.loads(r.read()), STATUS_SCHEMA)
    for method, path, code in (("POST", "/", 405), ("DELETE", "/status.json", 405),
                               ("GET", "/../state/queries", 404)):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(base + path, method=method))
        assert e.value.code == code
    req = urllib.request.Request(base + "/", method="HEAD")
    with urllib.request.urlopen(req) as r:
        assert r.read() == b"" and int(r.headers["Content-Length"]) == len(page.encode())


def test_serve_page_renders_in_chromium_and_refreshes_itself(served, tmp_path):
    import re
    import signal
    import subprocess

    from tests.test_html_diff import CHROMIUM, FLAGS, _chromium, _png_size

    server, looks = served
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    shot = tmp_path / "serve.png"
    _chromium(tmp_path, "--window-size=1280,900", "--hide-scrollbars",
              f"--screenshot={shot}", url)
    data = shot.read_bytes()
    assert _png_size(data) == (1280, 900) and len(data) > 20_000  # drawn, not blank
    dom = _chromium(tmp_path, "--dump-dom", url).stdout
    rows = dict(re.findall(r'<tr class="query" data-query="(\w+)"([^>]*)>', dom))
    assert sorted(rows) == ["alpha", "beta", "delta", "gamma"]
    assert 'data-alive="true" data-lag="110" data-phase="shadow"' in rows["alpha"]
    assert 'data-alive="false" data-lag="" data-phase=""' in rows["beta"]
    assert 'data-alive="false"' in rows["delta"] and 'data-alive="true"' in rows["gamma"]
    assert '<div class="bar" data-fraction="0.4000"><span style="width:40.0%">' in dom
    assert "backfill 40%: 400/1,000 records (+200 since)" in dom
    assert "owner unknown" in dom and "2. shadow" in dom
    # the fleet picture: one box per query, drawn by the fleet page's code
    boxes = re.findall(r'<g class="query" data-query="(\w+)"', dom)
    assert sorted(boxes) == ["alpha", "beta", "delta", "gamma"]
    assert 'g.query[data-query="alpha"] > rect:first-of-type { stroke: #ef6c00;' in dom
    # left open (a browser on the page, nothing asked of it), it reloads by itself: the
    # page asks no script, its meta refresh does (virtual time would reload it in a loop)
    looks.clear()
    browser = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'open'}",
                                "--remote-debugging-port=0", url],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(looks) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        os.killpg(browser.pid, signal.SIGTERM)
        browser.wait(30)
    assert len(looks) >= 3, looks
    gaps = [b - a for a, b in zip(looks, looks[1:])]
    assert all(0.8 < g < 5 for g in gaps), gaps  # every second or so (refresh=1)


def test_serve_refuses_a_port_in_use(store):
    from migrate import serve

    first = serve.make_server(store, 0)
    try:
        with pytest.raises(Exception) as e:
            serve.make_server(store, first.server_address[1])
        assert e.value.exit_code == 4 and "cannot listen on 127.0.0.1:" in e.value.message
    finally:
        first.server_close()
