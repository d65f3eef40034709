"""`theseus plan diff --html`: the page is opened in headless Chromium, rendered, and
checked (screenshot non-empty, node labels, matched pairs and finding marks present)."""

from __future__ import annotations

import re
import shutil
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
