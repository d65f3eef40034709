"""``theseus migrate start --fleet NEW_DIR`` without services: which queries of the fleet
changed, how they are grouped (chained changed queries together, as one cascade), what is
left alone, and what the command runs for each group."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from compat.check import load_plan
from compat.errors import InvalidRequest
from compat.fleet.graph import load_fleet
from compat.serde import dumps
from migrate import cascade, fleet, migration
from migrate.cli import main
from migrate.record import Migration
from migrate.store import DirectoryStore
from tests.test_cascade import down_plan, up_plan


def fleet_dirs(tmp_path):
    """Running: a -> b (through t), c -> d (through u), and x alone; the new fleet changes
    a and b (chained), d (whose upstream c is unchanged) and x, and adds y, which the store
    does not know."""
    old = {"a": up_plan("a", src="s", mid="t"), "b": down_plan("b", mid="t", out="o"),
           "c": up_plan("c", src="s2", mid="u"), "d": down_plan("d", mid="u", out="o2"),
           "x": up_plan("x", src="s3", mid="v")}
    new = dict(old, a=up_plan("a", src="s", mid="t", new=True),
               x=up_plan("x", src="s3", mid="v", new=True),
               y=down_plan("y", mid="v", out="o3"))
    new["b"] = json.loads(json.dumps(old["b"]))
    new["b"]["nodes"][1]["aggregates"].append({"name": "n", "function": "count", "args": []})
    new["d"] = json.loads(json.dumps(old["d"]))
    new["d"]["nodes"][1]["aggregates"][0]["function"] = "max"
    store = DirectoryStore(tmp_path / "state")
    (tmp_path / "old").mkdir()
    (tmp_path / "new" / "sub").mkdir(parents=True)
    for q, doc in old.items():
        f = tmp_path / "old" / f"{q}.json"
        f.write_text(json.dumps(doc))
        store.put_plan(q, dumps(load_plan(str(f))))
        store.set_status(q, status="running", generation=0)
    for q, doc in new.items():  # a folder tree: plans anywhere under NEW_DIR
        (tmp_path / "new" / ("sub" if q in "bd" else "") / f"{q}.json").write_text(
            json.dumps(doc, indent=2))
    return store, str(tmp_path / "new")


def test_changed_queries_are_grouped_by_the_topics_between_them(tmp_path):
    store, root = fleet_dirs(tmp_path)
    ch = fleet.changes(store, load_fleet(root))
    assert ch.groups == [["a", "b"], ["d"], ["x"]]
    assert ch.unchanged == ["c"] and ch.not_running == ["y"]
    text = ch.describe(root)
    assert "a -> b (one cascade)" in text and "not running here" in text and "y" in text


def test_a_fleet_that_runs_its_plans_has_nothing_to_migrate(tmp_path):
    store, root = fleet_dirs(tmp_path)
    ch = fleet.changes(store, load_fleet(str(tmp_path / "old")))
    assert ch.groups == [] and ch.unchanged == ["a", "b", "c", "d", "x"]
    assert "nothing to migrate" in ch.describe("old")


def test_start_runs_one_cascade_per_chained_group_and_one_migration_per_lone_query(
        tmp_path, monkeypatch):
    store, root = fleet_dirs(tmp_path)
    calls: list = []

    def fake_single(store_, query, path, **kw):
        calls.append(("single", query, path, kw["strategy"], kw["bootstrap"]))
        return Migration(id="m", query=query, new_plan=path, old_instance=query,
                         phase="done")

    def fake_cascade(store_, paths, **kw):
        calls.append(("cascade", [load_plan(p).query for p in paths], kw["bootstrap"]))
        return cascade.Cascade(id="c", migrations=[], queries=[], links=[], phase="done")

    monkeypatch.setattr(migration, "start", fake_single)
    monkeypatch.setattr(cascade, "start", fake_cascade)
    done = fleet.start(store, root, bootstrap="h:1", echo=lambda s: None)
    assert calls == [("cascade", ["a", "b"], "h:1"),
                     ("single", "d", f"{root}/sub/d.json", "auto", "h:1"),
                     ("single", "x", f"{root}/x.json", "auto", "h:1")]
    assert done == [(["a", "b"], "done"), (["d"], "done"), (["x"], "done")]


def test_in_place_is_refused_for_a_chained_group_before_anything_starts(tmp_path,
                                                                        monkeypatch):
    store, root = fleet_dirs(tmp_path)
    monkeypatch.setattr(migration, "start", lambda *a, **k: pytest.fail("started"))
    with pytest.raises(InvalidRequest, match="one cascade") as e:
        fleet.start(store, root, strategy="in-place", bootstrap="h:1", echo=lambda s: None)
    assert "a -> b" in e.value.render()


@pytest.mark.parametrize("args", [[], ["p.json", "--fleet", "dir"]])
def test_the_cli_wants_plans_or_a_fleet(tmp_path, args):
    r = CliRunner().invoke(main, ["migrate", "start", *args, "--bootstrap", "h:1",
                                  "--state", str(tmp_path)])
    assert r.exit_code == 2 and "--fleet NEW_DIR" in r.output


def test_the_cli_with_an_unchanged_fleet_says_so_and_exits_0(tmp_path):
    store, root = fleet_dirs(tmp_path)
    r = CliRunner().invoke(main, ["migrate", "start", "--fleet", str(tmp_path / "old"),
                                  "--bootstrap", "h:1", "--state", str(store.root)])
    assert r.exit_code == 0, r.output
    assert "nothing to migrate" in r.output


def test_the_cli_names_a_fleet_folder_that_is_not_there(tmp_path):
    r = CliRunner().invoke(main, ["migrate", "start", "--fleet", str(tmp_path / "nope"),
                                  "--bootstrap", "h:1", "--state", str(tmp_path)])
    assert r.exit_code == 2 and "nope" in r.output and "Traceback" not in r.output
