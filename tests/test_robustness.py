"""No traceback, ever, and never exit 1 for a crash: every failure a user can cause is one
line and exit 2; anything else is an "internal error" (exit 2) whose traceback goes to a
file the line names.  Each case here was found by hand or by ``tests/test_fuzz.py``."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from migrate.cli import main
from tests.conftest import FIXTURES, UPGRADES

SHIP = str(FIXTURES / "plans" / "ship_load.json")
CASE = {c.name: c for c in UPGRADES}


def run(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        repr(result.exception)
    assert "Traceback" not in result.output
    return result


# -- the guard ------------------------------------------------------------------------------


def test_a_crash_is_exit_2_with_internal_error_and_the_traceback_in_a_file(monkeypatch):
    import compat.check

    def boom(*a, **kw):
        raise KeyError("a bug")

    monkeypatch.setattr(compat.check, "check_files", boom)
    r = run("check", SHIP, SHIP)
    assert r.exit_code == 2
    line = r.output.strip()
    assert line.count("\n") == 0
    assert line.startswith("theseus: internal error: KeyError")
    path = re.search(r"details in (\S+?)\)", line).group(1)
    details = Path(path).read_text()
    Path(path).unlink()
    assert "Traceback" in details and "boom" in details and "check" in details


def test_a_crash_in_the_installed_command_is_exit_2_not_1(tmp_path):
    # The console entry point, as CI runs it: a crash must not read as "migrate" (exit 1).
    script = ("import sys, compat.check\n"
              "def boom(*a, **k): raise ZeroDivisionError('x')\n"
              "compat.check.check_files = boom\n"
              "from migrate.cli import entry\n"
              f"sys.argv = ['theseus', 'check', {SHIP!r}, {SHIP!r}]\n"
              "entry()\n")
    root = Path(__file__).resolve().parent.parent
    p = subprocess.run([__import__("sys").executable, "-c", script], capture_output=True,
                       text=True, cwd=root, env={"PYTHONPATH": str(root), "PATH": "/usr/bin"})
    assert p.returncode == 2, p.stderr
    assert "internal error: ZeroDivisionError" in p.stderr and "Traceback" not in p.stderr
    Path(re.search(r"details in (\S+?)\)", p.stderr).group(1)).unlink()


def test_usage_errors_and_help_keep_their_exit_codes():
    assert run("check", "--format", "yaml", SHIP, SHIP).exit_code == 2
    assert run("--help").exit_code == 0
    assert run("check", "--help").exit_code == 0


# -- output files ---------------------------------------------------------------------------


def test_output_into_a_folder_that_does_not_exist(tmp_path):
    missing = tmp_path / "no" / "such" / "report.json"
    r = run("check", SHIP, SHIP, "-o", str(missing))
    assert r.exit_code == 2
    assert str(missing) in r.output and "no such folder" in r.output
    old = str(CASE["source_topic_changed"] / "old.sql")
    r = run("plan", "compile", old, "-o", str(missing))
    assert r.exit_code == 2 and "cannot write the output file" in r.output
    r = run("plan", "diff", SHIP, SHIP, "--html", str(missing))
    assert r.exit_code == 2 and "cannot write the output file" in r.output


# -- check --against --------------------------------------------------------------------------


def test_against_with_a_path_outside_the_repository(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q",
                    "--allow-empty", "-m", "base"], cwd=repo, check=True)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    monkeypatch.chdir(repo)
    r = run("check", "--against", "HEAD", str(outside))
    assert r.exit_code == 2
    assert "outside the git repository" in r.output and str(outside) in r.output


# -- JSON documents -------------------------------------------------------------------------


def _ship_text() -> str:
    return Path(SHIP).read_text()


def _write(tmp_path, text: str, name: str = "bad.json") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def _one_error(r, *needles: str) -> str:
    assert r.exit_code == 2, r.output
    line = r.output.strip()
    assert line.count("\n") == 0 and line.startswith("theseus: error:"), line
    assert "please report" not in line and "internal error" not in line
    for needle in needles:
        assert needle in line, f"{needle!r} not in {line!r}"
    return line


def test_a_number_of_thousands_of_digits_is_refused_with_its_pointer(tmp_path):
    bad = _write(tmp_path, _ship_text().replace('"partitions": 3', '"partitions": ' + "9" * 5000))
    _one_error(run("check", SHIP, bad), "bad.json", "node 'packages'", "/nodes/0/partitions",
               "number too large", "5000 digits")


def test_nan_and_infinity_are_not_json(tmp_path):
    for const in ("NaN", "Infinity", "-Infinity"):
        bad = _write(tmp_path, _ship_text().replace('"partitions": 3', f'"partitions": {const}'))
        _one_error(run("plan", "validate", bad), "/nodes/0/partitions", f"'{const}' is not JSON")


def test_a_key_twice_in_one_object_is_refused_not_last_one_wins(tmp_path):
    text = _ship_text().replace('"predicate": "load > capacity * 0.9"',
                                '"predicate": "load > capacity * 0.9", "predicate": "true"')
    bad = _write(tmp_path, text)
    _one_error(run("check", SHIP, bad), "bad.json", "node 'over_capacity'",
               "/nodes/4/predicate", "duplicate key 'predicate'", "2 times")
    # at the top level, and inside a list of objects
    bad = _write(tmp_path, '{"query": "a", "query": "b", "nodes": []}')
    _one_error(run("plan", "validate", bad), "at /query:", "duplicate key 'query'")
    text = _ship_text().replace('{"name": "weight", "type": "double"}',
                                '{"name": "weight", "type": "double", "type": "string"}')
    _one_error(run("plan", "validate", _write(tmp_path, text)),
               "/nodes/0/schema/1/type", "duplicate key 'type'")
    # the same key in two different objects is fine
    assert run("plan", "validate", SHIP).exit_code == 0


def test_a_float_where_an_integer_belongs_is_expected_an_integer(tmp_path):
    for value in ("1e308", "3.0", "1e400"):
        bad = _write(tmp_path, _ship_text().replace('"partitions": 3', f'"partitions": {value}'))
        _one_error(run("check", SHIP, bad), "/nodes/0/partitions", "expected an integer")


def _with(tmp_path, old: str, new: str, source: Path = Path(SHIP)) -> str:
    text = source.read_text()
    assert old in text
    return _write(tmp_path, text.replace(old, new))


def test_partition_counts_are_java_ints(tmp_path):
    assert run("plan", "validate", _with(tmp_path, '"partitions": 3',
                                         '"partitions": 2147483647')).exit_code == 0
    _one_error(run("plan", "validate", _with(tmp_path, '"partitions": 3',
                                             '"partitions": 2147483648')),
               "/nodes/0/partitions", "a number <= 2147483647", "found 2147483648")
    _one_error(run("plan", "validate", _with(tmp_path, '"state_partitions": 4',
                                             '"state_partitions": 99999999999')),
               "/config/state_partitions", "<= 2147483647")
    rec = CASE["recursive_feedback_changed"] / "old.json"
    import json

    doc = json.loads(rec.read_text())
    node = next(n for n in doc["nodes"] if n["step"] == "recursive")
    node["feedback"]["partitions"] = 2**31
    _one_error(run("plan", "validate", _write(tmp_path, json.dumps(doc))),
               "/feedback/partitions", "<= 2147483647")


def test_json_nested_beyond_the_recursion_limit(tmp_path):
    bad = _write(tmp_path, "[" * 100_000 + "]" * 100_000)
    _one_error(run("check", SHIP, bad), "bad.json", "nested too deeply")


def test_a_node_equal_to_the_old_one_only_by_python_equality_is_validated(tmp_path):
    # 3.0 == 3 and True == 1 in Python: a node must not pass for the valid old one.
    for old, new, ptr in [('"partitions": 3', '"partitions": 3.0', "/nodes/0/partitions"),
                          ('"partitions": 1', '"partitions": true', "/nodes/1/partitions"),
                          ('"version": 1, "inputs": ["load"]',
                           '"version": true, "inputs": ["load"]', "/nodes/4/version")]:
        _one_error(run("check", SHIP, _with(tmp_path, old, new)), ptr, "expected an integer")


# -- expressions: huge numbers, deep nesting --------------------------------------------------

SHAPES = {  # an expression over the filter's input that nests ``n`` levels deep
    "parentheses": lambda n: "(" * (n - 1) + "load" + ")" * (n - 1) + " > 1",
    "calls": lambda n: "abs(" * (n - 2) + "load" + ")" * (n - 2) + " > 1",
    "right_nested_plus": lambda n: "load + (" * (n - 2) + "load" + ")" * (n - 2) + " > 1",
    "or_chain": lambda n: " OR ".join(["load > 1"] * (n - 1)),
    "not_chain": lambda n: "NOT " * (n - 2) + "load > 1",
    "case": lambda n: "CASE WHEN load > 1 THEN " * (n - 2) + "true" + " END" * (n - 2),
    "minus_chain": lambda n: "- " * (n - 2) + "load > 1",
}


def _predicate(tmp_path, predicate: str) -> str:
    import json

    doc = json.loads(Path(SHIP).read_text())
    doc["nodes"][4]["predicate"] = predicate
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(doc))
    return str(p)


def test_expressions_as_deep_as_allowed_are_checked_in_every_format(tmp_path):
    from compat.expr import MAX_DEPTH

    for name, shape in SHAPES.items():
        plan = _predicate(tmp_path, shape(MAX_DEPTH))
        for fmt in ("text", "json", "sarif"):
            r = run("check", SHIP, plan, "--format", fmt)
            assert r.exit_code in (0, 1, 3), (name, r.output[-300:])
        assert run("plan", "show", plan).exit_code == 0, name


def test_expressions_deeper_than_allowed_are_one_error(tmp_path):
    from compat.expr import MAX_DEPTH

    for name, shape in SHAPES.items():
        for n in (MAX_DEPTH + 1, 1000, 20_000):
            r = run("check", SHIP, _predicate(tmp_path, shape(n)))
            assert r.exit_code == 2, name
            _one_error(r, "/nodes/4/predicate", "nested too deeply", f"at most {MAX_DEPTH}")


@pytest.mark.parametrize("literal, needles", [
    ("9" * 5000, ["out of range", "5000 digits", "at most 38 digits"]),
    ("1" * 39, ["out of range", "39 digits"]),
    ("1." + "5" * 40, ["out of range", "41 digits"]),
    ("1e400", ["out of range", "a double"]),
    ("99999999999999999999L", ["out of range", "a bigint"]),
    ("1000Y", ["out of range", "a tinyint"]),
    ("1e5L", ["invalid number literal"]),
])
def test_number_literals_spark_refuses(tmp_path, literal, needles):
    r = run("check", SHIP, _predicate(tmp_path, f"load > {literal}"))
    _one_error(r, "/nodes/4/predicate", *needles)


def test_number_literals_are_typed_as_spark_types_them():
    from compat import expr as E

    scope = E.Scope({})
    typed = {text: E.infer_type(E.parse(text), scope) for text in (
        "2147483647", "2147483648", "-2147483648", "9223372036854775807",
        "9223372036854775808", "-9223372036854775808", "-9223372036854775809",
        "99999999999999999999", "1" * 38, "1e308", "9.9BD", "127Y", "5S", "7L")}
    assert typed == {  # as SELECT <literal> in Spark 4.3
        "2147483647": "int", "2147483648": "bigint", "-2147483648": "int",
        "9223372036854775807": "bigint", "9223372036854775808": "decimal(19,0)",
        "-9223372036854775808": "bigint", "-9223372036854775809": "decimal(19,0)",
        "99999999999999999999": "decimal(20,0)", "1" * 38: "decimal(38,0)",
        "1e308": "double", "9.9BD": "decimal(2,1)", "127Y": "tinyint", "5S": "smallint",
        "7L": "bigint"}



# -- found by tests/test_fuzz.py ----------------------------------------------------------------


def test_a_node_id_of_the_wrong_type_in_the_new_plan(tmp_path):
    # the new plan is read against the old one by node id: a list is no key
    import json

    doc = json.loads(Path(SHIP).read_text())
    doc["nodes"][5]["id"] = ["alerts"]
    _one_error(run("check", SHIP, _write(tmp_path, json.dumps(doc))), "/nodes/5/id",
               "expected a string")


@pytest.mark.parametrize("text", ["\n", "\n\n\n", " ", "\ufeff"])
def test_a_blank_file_is_malformed_json(tmp_path, text):
    _one_error(run("check", SHIP, _write(tmp_path, text)), "bad.json", "malformed JSON")


def test_double_minus_starts_a_comment_in_spark(tmp_path):
    from compat import expr as E

    _one_error(run("check", SHIP, _predicate(tmp_path, "load > --7")),
               "'--' at column 8 starts a comment")
    assert E.render(E.parse("- -7")) == "(- -7)" == E.canonical("-(-7)")
    assert run("check", SHIP, _predicate(tmp_path, "load > - -7")).exit_code == 0


@pytest.mark.parametrize("where, bad, needles", [
    ("schema", "decimal(" + "9" * 5000 + ",2)", ["too large in type"]),
    ("schema", "array<" * 1000 + "int" + ">" * 1000, ["nests more than 100 levels"]),
    ("predicate", "CAST(load AS decimal(" + "9" * 5000 + ",2)) > 1", ["too large in type"]),
    ("predicate", "CAST(load AS " + "array<" * 1000 + "int" + ">" * 1000 + ") IS NULL",
     ["nests more than 100 levels"]),
])
def test_hostile_type_strings(tmp_path, where, bad, needles):
    import json

    doc = json.loads(Path(SHIP).read_text())
    if where == "schema":
        doc["nodes"][0]["schema"][1]["type"] = bad
        ptr = "/nodes/0/schema/1/type"
    else:
        doc["nodes"][4]["predicate"] = bad
        ptr = "/nodes/4/predicate"
    _one_error(run("check", SHIP, _write(tmp_path, json.dumps(doc))), ptr, *needles)


def test_a_large_broken_plan_names_its_first_broken_node(tmp_path):
    # jsonschema alone lists every error of every node: minutes for 200,000 broken nodes
    import json

    doc = json.loads(Path(SHIP).read_text())
    filler = {"id": "f", "step": "filter", "version": 1, "inputs": ["load"],
              "predicate": "true"}
    doc["nodes"][4:4] = [{**filler, "id": f"f{i}"} for i in range(3000)]
    doc["nodes"][2500].pop("version")
    for n in doc["nodes"][2600:2700]:
        n["step"] = "fliter"
    _one_error(run("plan", "validate", _write(tmp_path, json.dumps(doc))),
               "node 'f2496', at /nodes/2500:", "missing required field 'version'")


def test_freeze_of_a_case_that_does_not_exist(tmp_path):
    _one_error(run("plan", "freeze", str(tmp_path / "nope")), "no such history case")


def test_a_lone_surrogate_in_a_string_is_not_unicode_text(tmp_path):
    import json

    doc = json.loads(Path(SHIP).read_text())
    doc["nodes"][4]["description"] = "half a pair: \ud800"
    _one_error(run("check", SHIP, _write(tmp_path, json.dumps(doc))),
               "node 'over_capacity', at /nodes/4/description", "lone surrogate", "\\ud800")
    # an escaped pair is one character: fine
    doc["nodes"][4]["description"] = "\U0001F600"
    assert run("check", SHIP, _write(tmp_path, json.dumps(doc))).exit_code == 0


def test_negating_a_negative_typed_literal(tmp_path):
    assert run("check", SHIP, _predicate(tmp_path, "load > - -127Y")).exit_code == 0
    assert run("check", SHIP, _predicate(tmp_path, "load > -(-128S)")).exit_code == 0


def test_against_with_a_json_file_nested_too_deeply(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "plans").mkdir(parents=True)
    (repo / "plans" / "a.json").write_text(Path(SHIP).read_text())
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "add", "."], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "b"],
                   cwd=repo, check=True)
    (repo / "plans" / "a.json").write_text("[" * 100_000)
    monkeypatch.chdir(repo)
    r = run("check", "--against", "HEAD", "plans")
    assert r.exit_code == 2 and "invalid" in r.output and "nested too deeply" in r.output


def test_a_lone_surrogate_in_a_node_id_under_against(tmp_path, monkeypatch):
    import json

    repo = tmp_path / "repo"
    (repo / "plans").mkdir(parents=True)
    (repo / "plans" / "a.json").write_text(Path(SHIP).read_text())
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "add", "."], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "b"],
                   cwd=repo, check=True)
    doc = json.loads(Path(SHIP).read_text())
    doc["nodes"][5]["id"] = "\ud800"
    (repo / "plans" / "a.json").write_text(json.dumps(doc))
    monkeypatch.chdir(repo)
    for fmt in ("text", "markdown", "github", "json", "sarif"):
        r = run("check", "--against", "HEAD", "plans", "--format", fmt, "-o",
                str(tmp_path / "out.txt"))
        assert r.exit_code == 2, r.output
        r = run("check", "--against", "HEAD", "plans", "--format", fmt)
        assert r.exit_code == 2 and "internal error" not in r.output


def test_nodes_equal_to_the_old_ones_are_still_reused(tmp_path):
    # the type-strict comparison must not tell equal documents apart (marshal's default
    # format writes back-references that depend on reference counts: version 0 has none)
    from compat.check import load_plan

    for src in [Path(SHIP)] + [CASE[c] / "old.json" for c in ("recursive_body_changed",
                                                              "partition_by_changed_top_n",
                                                              "explode_outer_changed")]:
        old = load_plan(str(src))
        new = load_plan(_write(tmp_path, src.read_text(), "copy.json"), reuse=old)
        assert all(new.nodes[n] is old.nodes[n] for n in old.nodes), src


def test_plan_show_of_a_chain_deeper_than_python_recursion(tmp_path):
    import json

    doc = json.loads(Path(SHIP).read_text())
    chain = [{"id": f"c{i}", "step": "filter", "version": 1,
              "inputs": [f"c{i - 1}" if i else "over_capacity"], "predicate": "load > 0"}
             for i in range(3000)]
    doc["nodes"][5]["inputs"] = ["c2999"]
    doc["nodes"][5:5] = chain
    plan = _write(tmp_path, json.dumps(doc))
    r = run("plan", "show", plan)
    assert r.exit_code == 0, r.output[-300:]
    lines = r.output.split("\n\n")[0].splitlines()  # the tree, without the legend
    assert len(lines) == len(doc["nodes"]) + 1
    assert max(map(len, lines)) < 200  # the indent stops growing
    assert lines[-1].strip() == "└─ ships: source v1 [enforcing] [I,UA]"


@pytest.mark.parametrize("depth", [2, 300])
def test_recursive_steps_nested_hundreds_deep(tmp_path, depth):
    import copy
    import json

    src = CASE["recursive_body_changed"] / "old.json"
    doc = json.loads(src.read_text())
    outer = next(n for n in doc["nodes"] if n["step"] == "recursive")
    template = copy.deepcopy(outer)
    cur = outer
    for i in range(depth):
        inner = {**copy.deepcopy(template), "id": f"r{i}", "inputs": [cur["body_input"]]}
        cur["body"].append(inner)
        cur = inner
    plan = _write(tmp_path, json.dumps(doc))
    for args in (("check", str(src), plan), ("plan", "validate", plan)):
        _one_error(run(*args), "node 'r0', at /nodes/1/body/2/step",
                   "a recursive step cannot be inside a recursive body")
