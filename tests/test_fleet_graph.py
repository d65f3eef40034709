"""The fleet: loading a directory tree (or a git ref) of plans, the global graph, and
``theseus fleet show`` in text, JSON (against its schema) and HTML (rendered in headless
Chromium)."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys

import jsonschema
import pytest
from click.testing import CliRunner

from compat.errors import CheckError, FleetError
from compat.fleet.graph import load_fleet, load_fleet_at, load_fleet_files
from compat.fleet.show import describe
from compat.schema_check import load_schema
from migrate.cli import main
from tests.conftest import FIXTURES, ROOT
from tests.test_html_diff import _chromium, _png_size

SHIP = FIXTURES / "fleets" / "ship"
CYCLE = FIXTURES / "fleets" / "cycle"


def plan(query: str, reads: list[str], writes: str) -> bytes:
    """A plan that reads ``reads`` (one source each, unioned) and writes ``writes``."""
    schema = [{"name": "k", "type": "string"}, {"name": "v", "type": "int"}]
    nodes: list[dict] = [{"id": f"src_{t}", "step": "source", "version": 1, "topic": t,
                          "partitions": 1, "format": "json", "role": "stream",
                          "schema": schema} for t in reads]
    last = nodes[0]["id"]
    if len(reads) > 1:
        nodes.append({"id": "all", "step": "union", "version": 1,
                      "inputs": [n["id"] for n in nodes]})
        last = "all"
    nodes.append({"id": "out", "step": "sink", "version": 1, "inputs": [last], "topic": writes,
                  "format": "json", "key_columns": ["k"], "mode": "append",
                  "delivery": "exactly_once"})
    return json.dumps({"format": "theseus.plan/1", "query": query, "nodes": nodes},
                      indent=1).encode()


def fleet_of(**queries: tuple[list[str], str]):
    return load_fleet_files("f", {f"{q}.json": plan(q, r, w) for q, (r, w) in queries.items()})


def run(*args: str):
    return CliRunner().invoke(main, list(args))


# -- the graph ---------------------------------------------------------------------------------


def test_ship_fleet_order_edges_and_external_topics():
    fleet = load_fleet(str(SHIP))
    assert fleet.order() == ["ship_load", "alert_counts", "overload_pager"]
    assert {n: q.path for n, q in fleet.queries.items()} == {
        "alert_counts": "alert_counts.sql", "overload_pager": "overload_pager.json",
        "ship_load": "ship_load.json"}
    assert fleet.producers == {"ship_alerts": "ship_load", "pager": "overload_pager",
                               "alert_counts": "alert_counts"}
    assert fleet.consumers["ship_alerts"] == [("alert_counts", "ship_alerts"),
                                              ("overload_pager", "alerts")]
    assert fleet.queries["ship_load"].sources == {"packages": "packages", "ships": "ships"}
    assert fleet.external_inputs() == ["packages", "ships"]
    assert fleet.external_outputs() == ["alert_counts", "pager"]
    assert fleet.cycles() == []
    assert fleet.downstream("ship_load") == ["alert_counts", "overload_pager"]
    assert fleet.downstream("overload_pager") == []
    g = fleet.graph()
    assert sorted(g.edges(data="topic")) == [("ship_load", "alert_counts", "ship_alerts"),
                                             ("ship_load", "overload_pager", "ship_alerts")]
    assert g.edges["ship_load", "overload_pager"]["sources"] == ["alerts"]
    assert g.nodes["alert_counts"]["path"] == "alert_counts.sql"


def test_a_cycle_of_two_queries_is_reported_not_refused():
    fleet = load_fleet(str(CYCLE))
    assert fleet.cycles() == [["enrich", "retry"]]
    assert fleet.order() == ["enrich", "retry"]
    assert fleet.downstream("retry") == ["enrich"]  # itself excluded
    assert fleet.external_inputs() == ["tasks"] and fleet.external_outputs() == []
    r = run("fleet", "show", str(CYCLE))
    assert r.exit_code == 0 and "cycles: enrich -> retry -> enrich" in r.output


def test_cycles_start_at_their_smallest_name_and_are_kept_together_in_order():
    fleet = fleet_of(a=(["in"], "ta"), z=(["ta", "ty"], "tz"), b=(["tz"], "tb"),
                     y=(["tb"], "ty"), c=(["tb"], "tc"), s=(["ts"], "ts"))
    # z -> b -> y -> z is one cycle; s reads its own output
    assert fleet.cycles() == [["b", "y", "z"], ["s"]]
    # a feeds the cycle; the cycle's members stay together in name order; c is below it;
    # s stands alone, placed by its name
    assert fleet.order() == ["a", "b", "y", "z", "c", "s"]
    assert fleet.downstream("a") == ["b", "y", "z", "c"]


def test_order_is_upstream_first_and_deterministic():
    queries = dict(d=(["tb", "tc"], "td"), c=(["ta"], "tc"), b=(["ta"], "tb"), a=(["in"], "ta"),
                   x=(["in"], "tx"))
    fleet = fleet_of(**queries)
    assert fleet.order() == ["a", "b", "c", "d", "x"]
    assert fleet_of(**dict(reversed(queries.items()))).order() == fleet.order()
    # a long chain is no problem for the stack-based walks
    chain = {f"q{i:04d}": ([f"t{i}"], f"t{i + 1}") for i in range(1500)}
    assert fleet_of(**chain).order() == sorted(chain)


def test_hidden_folders_and_other_files_are_skipped(tmp_path):
    shutil.copytree(SHIP, tmp_path / "fleet")
    (tmp_path / "fleet" / ".theseus").mkdir()
    (tmp_path / "fleet" / ".theseus" / "status.json").write_text("{}")
    (tmp_path / "fleet" / "README.md").write_text("# the ship fleet")
    (tmp_path / "fleet" / "more").mkdir()
    (tmp_path / "fleet" / "more" / "q.json").write_bytes(plan("q", ["pager"], "pages"))
    fleet = load_fleet(str(tmp_path / "fleet"))
    assert sorted(fleet.queries) == ["alert_counts", "overload_pager", "q", "ship_load"]
    assert fleet.queries["q"].path == "more/q.json"


def test_renaming_node_ids_changes_nothing_in_the_global_graph(tmp_path):
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    for f in SHIP.iterdir():
        if f.suffix != ".json":
            shutil.copy(f, renamed / f.name)
            continue
        doc = json.loads(f.read_text())
        ids = {n["id"]: f"node_{i}_{n['id']}" for i, n in enumerate(doc["nodes"])}
        for n in doc["nodes"]:
            n["id"] = ids[n["id"]]
            n["inputs"] = [ids[i] for i in n.get("inputs", [])] or None
            if n["inputs"] is None:
                del n["inputs"]
        (renamed / f.name).write_text(json.dumps(doc))

    def without_ids(d: dict) -> dict:
        text = re.sub(r'"(source|sink)": "[^"]*"', r'"\1": "-"', json.dumps(d))
        return json.loads(re.sub(r'"sources": \[[^\]]*\]', '"sources": []', text))

    a, b = load_fleet(str(SHIP)), load_fleet(str(renamed))
    assert b.order() == a.order() and b.cycles() == a.cycles()
    assert sorted(b.graph().edges(data="topic")) == sorted(a.graph().edges(data="topic"))
    da, db = describe(a), describe(b)
    da["root"] = db["root"] = "-"
    assert db != da and without_ids(db) == without_ids(da)


# -- bad input: one message naming the file and the pointer, exit 2 ----------------------------


def _bad(tmp_path, files: dict[str, bytes | str]) -> str:
    for name, content in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content if isinstance(content, bytes) else content.encode())
    r = run("fleet", "show", str(tmp_path))
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and "internal error" not in r.output
    # one error (a SQL error repeats its line, underlined, under it)
    assert r.output.startswith("theseus: error: ") and r.output.count("theseus:") == 1
    return r.output


def test_two_queries_writing_one_topic(tmp_path):
    out = _bad(tmp_path, {"a.json": plan("a", ["in"], "t"), "b.json": plan("b", ["in"], "t")})
    assert f"{tmp_path}/b.json, node 'out', at /nodes/1/topic: two queries write the " \
           "topic 't'" in out
    assert f"query 'a' at {tmp_path}/a.json at /nodes/1/topic" in out


def test_two_queries_writing_one_topic_point_into_sql(tmp_path):
    sql = (SHIP / "alert_counts.sql").read_text().replace("topic 'alert_counts'",
                                                          "topic 'pager'")
    files = {p.name: p.read_bytes() for p in SHIP.iterdir()} | {"alert_counts.sql": sql}
    out = _bad(tmp_path, files)
    assert f"{tmp_path}/overload_pager.json, node 'out', at /nodes/3/topic: two queries " \
           "write the " \
           "topic 'pager'" in out
    assert f"query 'alert_counts' at {tmp_path}/alert_counts.sql:5:42" in out


def test_two_plans_of_one_query_name(tmp_path):
    out = _bad(tmp_path, {"a.json": plan("same", ["in"], "t1"),
                          "sub/b.json": plan("same", ["in"], "t2")})
    assert f"{tmp_path}/sub/b.json, at /query: two plans define the query 'same'" in out
    assert f"also the query of {tmp_path}/a.json at /query" in out


@pytest.mark.parametrize("content,found", [
    ('[1, 2]', "found a JSON array"),
    ('{"rows": [], "topic": "x"}', "found an object with keys 'rows', 'topic'"),
    ('{"format": "theseus.report/1", "verdict": "identical"}',
     "found an object with format 'theseus.report/1'"),
])
def test_a_json_file_that_is_not_a_plan(tmp_path, content, found):
    out = _bad(tmp_path, {"q.json": plan("q", ["in"], "t"), "data/expected.json": content})
    assert f"{tmp_path}/data/expected.json, at /: not a plan" in out and found in out


def test_an_invalid_plan_is_the_plan_readers_error(tmp_path):
    doc = json.loads(plan("q", ["in"], "t"))
    doc["nodes"][1]["inputs"] = ["nope"]
    out = _bad(tmp_path, {"q.json": json.dumps(doc)})
    assert f"{tmp_path}/q.json, node 'out', at /nodes/1/inputs/0: input 'nope' does not " \
           "exist" in out
    out = _bad(tmp_path, {"q.json": '{"query": "q", "nodes": [}'})
    assert f"{tmp_path}/q.json: malformed JSON at line 1" in out


def test_bad_sql_and_a_missing_folder(tmp_path):
    out = _bad(tmp_path, {"q.sql": "SELECT 1;"})
    assert f"{tmp_path}/q.sql:1:8:" in out
    r = run("fleet", "show", str(tmp_path / "nowhere"))
    assert r.exit_code == 2 and "nowhere: not a directory" in r.output


# -- at a git ref -------------------------------------------------------------------------------


def git(cwd, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout


def test_load_fleet_at_a_git_ref(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    shutil.copytree(SHIP, repo / "fleets" / "ship")
    git(repo, "init", "-q")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "fleet")
    (repo / "fleets" / "ship" / "overload_pager.json").unlink()
    (repo / "fleets" / "ship" / "late.json").write_bytes(plan("late", ["pager"], "late"))
    monkeypatch.chdir(repo)

    then = load_fleet_at("HEAD", "fleets/ship")
    assert then.root == "HEAD:fleets/ship"
    assert sorted(then.queries) == ["alert_counts", "overload_pager", "ship_load"]
    assert then.queries["alert_counts"].plan.file == "HEAD:fleets/ship/alert_counts.sql"
    assert then.order() == load_fleet(str(SHIP)).order()
    now = load_fleet("fleets/ship")
    assert sorted(now.queries) == ["alert_counts", "late", "ship_load"]
    assert now.external_inputs() == ["packages", "pager", "ships"]
    # a folder the ref did not have is an empty fleet: everything in it is new
    assert load_fleet_at("HEAD", "fleets/other").queries == {}
    with pytest.raises(CheckError, match="git ref 'nope' not found"):
        load_fleet_at("nope", "fleets/ship")
    # the ref's files are read, not the work tree's: a bad plan there is named at the ref
    (repo / "fleets" / "ship" / "late.json").write_text("[]")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "bad")
    with pytest.raises(FleetError, match="HEAD:fleets/ship/late.json, at /: not a plan"):
        load_fleet_at("HEAD", "fleets/ship")


# -- fleet show ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fleet", [SHIP, CYCLE])
def test_json_follows_the_fleet_schema(fleet):
    r = run("fleet", "show", str(fleet), "--format", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    jsonschema.validate(doc, load_schema("fleet.v1.json"))
    assert doc["shared"] == []


def test_shared_subplans_are_listed_in_json_text_and_html():
    """fixtures/fleets/share: three queries compute one prefix, written differently."""
    share = FIXTURES / "fleets" / "share"
    doc = json.loads(run("fleet", "show", str(share), "--format", "json").output)
    jsonschema.validate(doc, load_schema("fleet.v1.json"))
    [sh] = [s for s in doc["shared"] if s["kind"] == "partial"]
    assert sorted(m["query"] for m in sh["members"]) == ["big_orders", "eu_revenue",
                                                         "region_totals"]
    assert sh["short"] == sh["signature"][:12] and sh["topics"] == ["orders"]
    text = run("fleet", "show", str(share)).output
    assert f"partial {sh['short']}: {sh['steps']} steps over orders, computed by " in text
    page = run("fleet", "show", str(share), "--format", "html").output
    marked = re.findall(r'data-query="([^"]+)"[^>]*data-shared="([^"]*)"', page)
    assert sorted(q for q, s in marked if sh["short"] in s) == ["big_orders", "eu_revenue",
                                                               "region_totals"]
    assert page.count('class="shares"') == 3


def test_json_topics_carry_what_their_producer_writes():
    doc = describe(load_fleet(str(SHIP)))
    topics = {t["topic"]: t for t in doc["topics"]}
    assert topics["ship_alerts"]["written"] == {
        "columns": [{"name": "ship_id", "type": "string"}, {"name": "load", "type": "double"},
                    {"name": "capacity", "type": "double"}],
        "key_columns": ["ship_id"], "mode": "I,UB,UA,D", "format": "json", "sink": "alerts"}
    assert topics["ship_alerts"]["read_by"] == {"queries": 2, "sources": 2}
    assert topics["packages"]["external"] == "input" and topics["packages"]["written"] is None
    assert topics["pager"]["external"] == "output"
    assert doc["edges"] == [
        {"from": "ship_load", "to": "alert_counts", "topic": "ship_alerts",
         "sources": ["ship_alerts"]},
        {"from": "ship_load", "to": "overload_pager", "topic": "ship_alerts",
         "sources": ["alerts"]}]
    q = {x["query"]: x for x in doc["queries"]}
    assert q["ship_load"]["characteristics"] == ["stateful", "joined"]
    assert q["alert_counts"]["upstream"] == ["ship_load"]


def test_one_query_reading_a_topic_twice_counts_two_sources():
    doc = describe(load_fleet_files("f", {
        "p.json": plan("p", ["in"], "t"),
        "c.json": json.dumps(json.loads(plan("c", ["t", "in"], "o")) | {}).replace(
            '"topic": "in"', '"topic": "t"').encode()}))
    t = next(t for t in doc["topics"] if t["topic"] == "t")
    assert t["read_by"] == {"queries": 1, "sources": 2}
    assert doc["edges"] == [{"from": "p", "to": "c", "topic": "t", "sources": ["src_in", "src_t"]}]


def test_text_output(tmp_path):
    r = run("fleet", "show", str(SHIP))
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0] == (f"fleet {SHIP}: 3 queries, 5 topics (2 external inputs, 2 external "
                        "outputs), no cycles")
    body = "\n".join(lines)
    assert re.search(r"1\. ship_load +ship_load\.json +\(stateful, joined\) +reads packages, "
                     r"ships -> writes ship_alerts \[I,UB,UA,D\]", body)
    assert re.search(r"2\. alert_counts +alert_counts\.sql", body)
    assert "  ship_alerts: ship_load -> alert_counts (ship_alerts), overload_pager (alerts)\n" \
           "      json [I,UB,UA,D], key (ship_id): ship_id string, load double, capacity " \
           "double\n      read by 2 queries through 2 sources" in body
    assert "  packages: (external input) -> ship_load (packages)" in body
    for line in ("external inputs: packages, ships", "external outputs: alert_counts, pager",
                 "cycles: none", "shared subplans: none", "Legend:"):
        assert line in lines
    out = tmp_path / "fleet.txt"
    assert run("fleet", "show", str(SHIP), "-o", str(out)).output == ""
    assert out.read_text() == r.output


def test_reading_a_fleet_keeps_networkx_off_and_check_keeps_the_fleet_off():
    """``theseus check`` imports neither the fleet nor networkx; reading a fleet and
    printing it as text (what ``fleet check`` will do) does not import networkx either:
    only the graph and the drawing do."""
    old = str(FIXTURES / "upgrades" / "ship_load_capacity_rule_changed" / "old.json")
    code = (f"import sys; sys.argv=['theseus','check',{old!r},{old!r}]\n"
            "from migrate.cli import main\n"
            "try:\n    main()\n"
            "except SystemExit: pass\n"
            "print('LOADED', sorted(m for m in sys.modules if m.split('.')[0] == 'networkx'"
            " or m.startswith('compat.fleet')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout
    assert "LOADED []" in out, out
    code = (f"import sys; sys.argv=['theseus','fleet','show',{str(SHIP)!r}]\n"
            "from migrate.cli import main\n"
            "try:\n    main()\n"
            "except SystemExit: pass\n"
            "print('LOADED', 'networkx' in sys.modules)\n"
            "from compat.fleet.graph import load_fleet\n"
            f"load_fleet({str(SHIP)!r}).graph()\n"
            "print('GRAPH', 'networkx' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout
    assert "LOADED False" in out and "GRAPH True" in out, out


# -- the page, rendered in Chromium -------------------------------------------------------------

#: added to a copy of the page: measures what Chromium drew and writes it into the DOM
MEASURE = """<script>
const box = e => { const b = e.getBBox(); return [b.x, b.y, b.width, b.height]; };
const all = s => Array.from(document.querySelectorAll(s));
document.body.setAttribute("data-measure", JSON.stringify({
  svg: box(document.querySelector("svg.fleet")),
  size: [+document.querySelector("svg.fleet").getAttribute("width"),
         +document.querySelector("svg.fleet").getAttribute("height")],
  queries: all("g.query").map(g => [g.dataset.query, box(g.querySelector("rect")),
                                     all("g.query[data-query='" + g.dataset.query + "'] text")
                                       .map(box)]),
  topics: all("g.topic").map(g => [g.dataset.topic, box(g.querySelector("rect"))]),
  labels: all("text.label").map(t => [t.textContent, box(t)]),
}));
</script>"""


def _overlap(a, b) -> bool:
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and \
        b[1] < a[1] + a[3]


def _inside(inner, outer) -> bool:
    return outer[0] <= inner[0] and inner[0] + inner[2] <= outer[0] + outer[2] + 0.5 and \
        outer[1] <= inner[1] and inner[1] + inner[3] <= outer[1] + outer[3] + 0.5


def _fan_out_fleet(tmp_path):
    """The ship fleet, plus four readers of the pager topic (a wide row of boxes and
    labels) and a two-query cycle below them."""
    root = tmp_path / "fleet"
    shutil.copytree(SHIP, root)
    for i, name in enumerate(["pager_email", "pager_sms", "pager_audit_log_with_a_long_name",
                              "pager_dashboard"]):
        (root / f"{name}.json").write_bytes(plan(name, ["pager"], f"out_{i}"))
    (root / "loop_a.json").write_bytes(plan("loop_a", ["out_0", "loop_back"], "loop_fwd"))
    (root / "loop_b.json").write_bytes(plan("loop_b", ["loop_fwd"], "loop_back"))
    return root


@pytest.mark.parametrize("which", ["ship", "cycle", "share", "fan_out"])
def test_fleet_page_renders_in_chromium(tmp_path, which):
    root = {"ship": SHIP, "cycle": CYCLE, "share": FIXTURES / "fleets" / "share"}.get(which) \
        or _fan_out_fleet(tmp_path)
    fleet = load_fleet(str(root))
    page = tmp_path / "fleet.html"
    r = run("fleet", "show", str(root), "--format", "html", "-o", str(page))
    assert r.exit_code == 0 and r.output == "", r.output
    text = page.read_text()
    assert "<script" not in text and "http://" not in text.replace(
        "http://www.w3.org/2000/svg", "")  # self-contained

    shot = tmp_path / "fleet.png"
    _chromium(tmp_path, "--window-size=1280,900", "--hide-scrollbars", f"--screenshot={shot}",
              page.as_uri())
    data = shot.read_bytes()
    assert _png_size(data) == (1280, 900) and len(data) > 20_000  # drawn, not blank

    probe = tmp_path / "probe.html"
    probe.write_text(text.replace("</body>", MEASURE + "</body>"))
    dom = _chromium(tmp_path, "--dump-dom", probe.as_uri()).stdout
    found = re.search(r'data-measure="([^"]*)"', dom)
    assert found, dom[:2000]
    m = json.loads(html.unescape(found.group(1)))
    # one box per query, each drawn with a size, inside the drawing, its text inside it
    assert sorted(q for q, _, _ in m["queries"]) == sorted(fleet.queries)
    w, h = m["size"]
    canvas = [0, 0, w, h]
    for name, rect, texts in m["queries"]:
        assert rect[2] > 100 and rect[3] > 40 and _inside(rect, canvas), (name, rect)
        for t in texts:
            assert t[2] > 0 and _inside(t, rect), (name, t, rect)
    # external topics are small nodes
    externals = fleet.external_inputs() + fleet.external_outputs()
    assert sorted(t for t, _ in m["topics"]) == sorted(externals)
    # nothing overlaps: boxes and topic nodes, nor labels with each other or with boxes
    shapes = [r for _, r, _ in m["queries"]] + [r for _, r in m["topics"]]
    for i, a in enumerate(shapes):
        assert _inside(a, canvas)
        for b in shapes[i + 1:]:
            assert not _overlap(a, b), (a, b)
    labels = [b for _, b in m["labels"]]
    for i, a in enumerate(labels):
        assert _inside(a, canvas), m["labels"][i]
        assert not any(_overlap(a, s) for s in shapes), m["labels"][i]
        for j, b in enumerate(labels[i + 1:], start=i + 1):
            assert not _overlap(a, b), (m["labels"][i], m["labels"][j])
    # every edge between queries is labelled with its topic and changelog mode
    edges = fleet.graph().edges(data="topic")
    assert sorted(t for t, _ in m["labels"]) == sorted(
        f"{t} [{fleet.queries[p].plan.info[fleet.queries[p].plan.sink_id].mode}]"
        for p, _, t in edges)
    cycle = {q for c in fleet.cycles() for q in c}
    assert set(re.findall(r'data-query="([^"]+)" data-cycle="true"', dom)) == cycle
