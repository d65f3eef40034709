"""`theseus plan diff --html` / `--format html`: the page is opened in headless Chromium,
rendered, and checked (screenshot of the window's size and not blank, node labels, matched
pairs enforcing and passive, changed/added/removed marks, the changed fields old -> new and
finding marks present)."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess

import pytest
from click.testing import CliRunner

from migrate.cli import main
from tests.conftest import UPGRADES

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _chromium(tmp_path, *args):
    if CHROMIUM is None:
        pytest.fail("chromium is not installed (make test installs it: apt-get install "
                    "chromium)")
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                           *args], capture_output=True, text=True, timeout=120)


def test_plan_diff_html_renders_in_chromium(tmp_path):
    case = next(c for c in UPGRADES if c.name == "ship_load_package_count_added")
    page = tmp_path / "diff.html"
    r = CliRunner().invoke(main, ["plan", "diff", str(case / "old.json"),
                                  str(case / "new.json"), "--html", str(page)])
    assert r.exit_code == 1, r.output  # migrate
    html = page.read_text()
    assert "<script" not in html and "http://" not in html.replace(
        "http://www.w3.org/2000/svg", "")  # self-contained

    shot = tmp_path / "diff.png"
    _chromium(tmp_path, "--window-size=1400,800", f"--screenshot={shot}", page.as_uri())
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000

    dom = _chromium(tmp_path, "--dump-dom", page.as_uri()).stdout
    for label in ("alerts", "over_capacity", "load", "with_capacity", "packages", "ships"):
        assert f'data-id="{label}"' in dom
    # the aggregate whose function changed is marked 'migrate' on both sides
    assert len(re.findall(r'data-id="load" data-effect="migrate"', dom)) == 2
    # matched enforcing pairs carry badges in both drawings
    assert dom.count('class="badge"') == 2 * 5
    assert "aggregate-added" in dom


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_changed_fields_and_passive_pairs_are_drawn(tmp_path):
    case = next(c for c in UPGRADES if c.name == "ship_load_package_count_added")
    page = tmp_path / "diff.html"
    r = CliRunner().invoke(main, ["plan", "diff", str(case / "old.sql"), str(case / "new.sql"),
                                  "--format", "html", "-o", str(page)])
    assert r.exit_code == 1 and r.output == ""

    shot = tmp_path / "diff.png"
    _chromium(tmp_path, "--window-size=1280,900", "--hide-scrollbars", f"--screenshot={shot}",
              page.as_uri())
    data = shot.read_bytes()
    assert _png_size(data) == (1280, 900)
    assert len(data) > 20_000  # drawings and text, not a blank page

    dom = _chromium(tmp_path, "--dump-dom", page.as_uri()).stdout
    # the aggregate whose aggregates changed is marked changed on both sides...
    assert len(re.findall(r'data-id="aggregate_1" data-effect="migrate" '
                          r'data-status="changed"', dom)) == 2
    # ...and the field that changed is listed with its new value
    row = re.search(r'<tr class="step changed" data-old="aggregate_1" '
                    r'data-new="aggregate_1">(.*?)</tr>', dom, re.S)
    assert row, dom
    assert "<code>aggregates[packages]</code>: added" in row.group(1)
    assert "count" in row.group(1) and "<ins>" in row.group(1)
    # the HAVING filter is a passive pair: the same pale badge number on both sides
    badges = re.findall(r'data-id="having_1"(?:(?!</g>).)*?class="badge passive"[^>]*>(\d+)<',
                        dom)
    assert len(badges) == 2 and badges[0] == badges[1]
    assert dom.count('class="badge"') == 2 * 5  # the enforcing pairs


def test_added_and_removed_steps_are_marked(tmp_path):
    pages = {}
    for name in ("stateful_dedup_added_before_aggregate", "filter_removed_stream"):
        case = next(c for c in UPGRADES if c.name == name)
        page = tmp_path / f"{name}.html"
        CliRunner().invoke(main, ["plan", "diff", str(case / "old.json"),
                                  str(case / "new.json"), "--format", "html", "-o", str(page)])
        pages[name] = _chromium(tmp_path, "--dump-dom", page.as_uri()).stdout
    added = pages["stateful_dedup_added_before_aggregate"]
    assert re.search(r'<g class="node enforcing" data-id="dedup" data-effect="migrate" '
                     r'data-status="added">.*?stroke-dasharray', added)
    # the filter now behind the new dedup is still paired with its old self
    assert 'data-id="valid" data-effect="" data-status=""' in added
    assert '<tr class="step added" data-old="" data-new="dedup">' in added
    removed = pages["filter_removed_stream"]
    assert re.search(r'data-id="big" data-effect="in_place" data-status="removed"', removed)
    assert '<tr class="step removed" data-old="big" data-new="">' in removed


def test_layers_put_each_step_below_its_deepest_consumer():
    from compat.htmldiff import _layers
    from compat.serde import from_doc

    src = {"id": "s", "step": "source", "version": 1, "topic": "t", "partitions": 1,
           "format": "json", "role": "stream", "schema": [{"name": "a", "type": "int"}]}
    doc = {"format": "theseus.plan/1", "query": "q", "nodes": [
        src,
        {"id": "f", "step": "filter", "version": 1, "inputs": ["s"], "predicate": "a > 1"},
        {"id": "u", "step": "union", "version": 1, "inputs": ["f", "s"]},
        {"id": "out", "step": "sink", "version": 1, "inputs": ["u"], "topic": "o",
         "format": "json", "key_columns": [], "mode": "append", "delivery": "exactly_once"}]}
    # s feeds u directly and through f: it is drawn below f, not beside it
    assert _layers(from_doc(doc)) == {"out": 0, "u": 1, "f": 2, "s": 3}
