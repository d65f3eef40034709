"""Fuzzing the CLI as CI runs it: whatever a user feeds it, ``theseus`` answers with a verdict
(exit 0, 1 or 3) or one clear error (exit 2) -- never a traceback, never an "internal error".

Inputs are the fixture plans and SQL scripts, mutated: values replaced by hostile ones (numbers
of thousands of digits, floats where integers belong, deep nesting, odd Unicode, NUL bytes,
lone surrogates, every JSON type in every place), keys deleted, duplicated or added, expression
strings replaced by generated ones (deep, long, with unknown functions and huge literals), SQL
text cut, spliced and salted with the same; and raw bytes.  Commands run in-process through
click's CliRunner.

The example counts keep ``make test`` to a few tens of seconds and are derandomized, so a run
is repeatable; ``THESEUS_FUZZ_EXAMPLES=5000`` runs that many examples per test with fresh
random seeds (and Hypothesis's database) to hunt for more.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from migrate.cli import main
from tests.conftest import FIXTURES, UPGRADES

_BUDGET = os.environ.get("THESEUS_FUZZ_EXAMPLES")


def _settings(default: int) -> settings:
    # a budget explores at random, except under CI's profile, which derandomizes everything
    fixed = settings.default.derandomize or not _BUDGET
    return settings(max_examples=int(_BUDGET) if _BUDGET else default, deadline=None,
                    derandomize=fixed, database=None if fixed else settings.default.database,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


PLANS = [FIXTURES / "plans" / "ship_load.json"] + [c / "old.json" for c in UPGRADES]
SQLS = [c / "old.sql" for c in UPGRADES if (c / "old.sql").exists()]
DOCS = {p: json.loads(p.read_text()) for p in PLANS}
TEXTS = {p: p.read_text() for p in SQLS}
FORMATS = ["text", "json", "markdown", "sarif", "github"]

# -- hostile values ---------------------------------------------------------------------------

#: raw JSON texts that json.dumps cannot write (or would write differently)
RAW = ["9" * 5000, "-" + "9" * 5000, "1e308", "1e400", "-1e400", "NaN", "Infinity", "3.0",
       "2147483648", "99999999999999999999", "0.0000001", "-0", "1E2", "true", "null",
       "[" * 3000 + "]" * 3000, '{"a":' * 2000 + "1" + "}" * 2000, '"\\ud800"', '"\\u0000"']

_ODD = ["", " ", "\x00", "a\x00b", "\ud800", "\U0001F600", "e\u0301", "\u202e", "\ufeff",
        "\u00a0", "ｓｅｌｅｃｔ", "İ", "ß", "\n", "\t", "'", '"', "`", "\\", "--", "/*", "${x}",
        "x" * 100_000, "../../etc/passwd", "%s%n", "\r\n", "Ⅻ", "١٢٣"]

#: type strings: valid, odd and hostile
_TYPES = ["int", "bigint", "double", "string", "boolean", "timestamp", "timestamp_ntz",
          "date", "binary", "decimal(38,10)", "decimal(99,2)", "decimal(" + "9" * 5000 + ",2)",
          "array<int>", "array<" * 99 + "int" + ">" * 99, "array<" * 3000 + "int" + ">" * 3000,
          "map<string,int>", "map<array<int>,int>", "struct<a:int,b:string>",
          "struct<a:int,a:int>", "struct<>", "struct<`a b`:int>", "interval day to second",
          "void", "variant", "char(5)", "varchar(" + "9" * 50 + ")", "string collate utf8",
          "time(9)", "unknown", "dubble", "array<", "int>", ""]

_TOKENS = ["(", ")", "+", "-", "*", "/", "%", "=", "<=>", "!=", "<", ">=", "||", "&", "|",
           "^", "~", "!", "AND", "OR", "NOT", "IS", "NULL", "TRUE", "IN", "BETWEEN", "LIKE",
           "CASE", "WHEN", "THEN", "ELSE", "END", "CAST", "AS", "int", "string", "array<int>",
           "INTERVAL", "'5 minutes'", ",", ".", "[", "]", "->", "::", "DISTINCT", "OVER",
           "1", "0", "-1", "1.5", "1e5", "1e400", "9" * 50, "9" * 5000, "128Y", "99L", "1.5BD",
           "'a'", "'", '"', "`x`", "`", "x", "ts", "weight", "load", "capacity", "amount",
           "ship_id", "region", "sum", "count(*)", "upper", "my_udf", "reflect", "abs",
           "date_trunc", "window", "coalesce", "named_struct", "transform", "x -> x",
           "current_timestamp", "TIMESTAMP '2020-01-01'", "\x00", "\u00e9", "\U0001F600"]

_COLUMNS = ["ts", "weight", "load", "capacity", "amount", "ship_id", "region", "quantity",
            "customer_id", "order_id", "nope", "p.ship_id", "`odd name`"]
_LITERALS = ["1", "0", "-7", "1.5", "'x'", "NULL", "TRUE", "1e308", "1e400", "9" * 40,
             "2147483648", "127Y", "128Y", "INTERVAL '1' HOUR", "DATE '2020-01-01'",
             "TIMESTAMP '2020-01-01 00:00:00'", "array(1, 2)", "map('k', 1)"]
_FUNCS = ["abs", "upper", "sum", "coalesce", "if", "date_trunc", "size", "my_udf", "sqrt",
          "year", "concat", "greatest", "element_at", "cast_me", "reflect", "bool_and"]
_BINOPS = ["+", "-", "*", "/", "%", "div", "=", "!=", "<", ">=", "<=>", "AND", "OR", "||",
           "&", "|"]


def _expr_strategy() -> st.SearchStrategy[str]:
    leaf = st.sampled_from(_COLUMNS + _LITERALS)

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.tuples(inner, st.sampled_from(_BINOPS), inner).map(" ".join),
            st.tuples(st.sampled_from(_FUNCS), st.lists(inner, max_size=3)).map(
                lambda t: f"{t[0]}({', '.join(t[1])})"),
            inner.map(lambda x: f"({x})"),
            inner.map(lambda x: f"NOT {x}"),
            inner.map(lambda x: f"-{x}"),
            st.tuples(inner, inner, inner).map(lambda t: f"CASE WHEN {t[0]} THEN {t[1]} "
                                                         f"ELSE {t[2]} END"),
            st.tuples(inner, st.sampled_from(_TYPES)).map(
                lambda t: f"CAST({t[0]} AS {t[1]})"),
            st.tuples(inner, st.lists(inner, min_size=1, max_size=3)).map(
                lambda t: f"{t[0]} IN ({', '.join(t[1])})"),
        )

    structured = st.recursive(leaf, extend, max_leaves=12)
    tokens = st.lists(st.sampled_from(_TOKENS), min_size=1, max_size=12).map(" ".join)
    deep = st.tuples(st.sampled_from(["(", "abs(", "NOT ", "- ", "CASE WHEN x THEN "]),
                     st.integers(100, 20_000)).map(
        lambda t: t[0] * t[1] + "x" + {"(": ")", "abs(": ")"}.get(t[0], "") * t[1] +
        (" END" * t[1] if t[0].startswith("CASE") else ""))
    chain = st.tuples(st.sampled_from([" OR ", " + ", " AND ", " || "]),
                      st.integers(100, 20_000)).map(lambda t: t[0].join(["load > 1"] * t[1]))
    return st.one_of(structured, structured, tokens, deep, chain, st.sampled_from(_ODD))


EXPRESSIONS = _expr_strategy()

_json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False,
                                                                     allow_infinity=False),
    st.sampled_from(_ODD), st.text(max_size=20), EXPRESSIONS, st.sampled_from(_TYPES))
JSON_VALUES = st.recursive(_json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=10)


# -- running the CLI ----------------------------------------------------------------------------


def _run(*args: str) -> int:
    result = CliRunner().invoke(main, list(args))
    out = result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        f"{args}: {result.exception!r}"
    assert result.exit_code in (0, 1, 2, 3), (args, result.exit_code, out[-500:])
    assert "Traceback" not in out, out[-2000:]
    assert "internal error" not in out, out[-2000:]
    if result.exit_code == 2 and "--against" not in args:  # that reports invalid plans
        errors = [ln for ln in out.splitlines() if ln.startswith("theseus: error:")]
        assert errors, out[-500:]
    return result.exit_code


def _seen(code: int) -> None:
    """Say which outcomes the examples reached (pytest --hypothesis-show-statistics)."""
    event(f"exit {code}")


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, prefix + (i,))


_MARK = "@@RAW@@"


def mutate(doc, picks) -> str:
    """The plan's JSON text with the picked mutations applied."""
    doc = copy.deepcopy(doc)
    raws: list[str] = []
    for pick, action, value, raw_pick, expr in picks:
        paths = [p for p in _paths(doc) if p]
        if not paths:
            break
        path = paths[pick % len(paths)]
        parent = doc
        for part in path[:-1]:
            parent = parent[part]
        last = path[-1]
        if action == "delete":
            del parent[last]
        elif action == "value":
            parent[last] = value
        elif action == "raw":
            raws.append(RAW[raw_pick % len(RAW)])
            parent[last] = _MARK
        elif action == "expr" or (action == "expr_if_string" and
                                  isinstance(parent[last], str)):
            parent[last] = expr
        elif action == "wrap":
            parent[last] = [parent[last]]
        elif action == "add_key" and isinstance(parent, dict):
            parent[f"{last}_x" if pick % 2 else "x-extra"] = value
    text = json.dumps(doc)
    for raw in raws:
        text = text.replace(json.dumps(_MARK), raw, 1)
    if picks and picks[0][1] == "duplicate":  # a key twice in one object
        text = re.sub(r'"id": ("[^"]*")', lambda m: f'"id": {m.group(1)}, "id": "again"',
                      text, count=1 + picks[0][0] % 3)
    return text


_PICKS = st.lists(st.tuples(
    st.integers(0, 10**6),
    st.sampled_from(["delete", "value", "raw", "expr", "expr_if_string", "expr_if_string",
                     "wrap", "add_key", "duplicate"]),
    JSON_VALUES, st.integers(0, 10**6), EXPRESSIONS), min_size=1, max_size=4)


@_settings(150)
@given(which=st.integers(0, len(PLANS) - 1), picks=_PICKS,
       fmt=st.sampled_from(FORMATS),
       command=st.sampled_from(["check", "validate", "show", "diff"]))
def test_mutated_plans_get_a_verdict_or_one_error(tmp_path_factory, which, picks, fmt,
                                                   command):
    d = tmp_path_factory.mktemp("plan")
    old = PLANS[which]
    new = d / "new.json"
    new.write_text(mutate(DOCS[old], picks), encoding="utf-8", errors="surrogatepass")
    if command == "check":
        _seen(_run("check", str(old), str(new), "--format", fmt))
        _run("check", str(new), str(old))
    elif command == "validate":
        _seen(_run("plan", "validate", str(new)))
    elif command == "diff":
        _seen(_run("plan", "diff", str(old), str(new), "--html", str(d / "diff.html")))
    else:
        _seen(_run("plan", "show", str(new)))


@_settings(120)
@given(which=st.integers(0, len(PLANS) - 1), expr=EXPRESSIONS, pick=st.integers(0, 10**6))
def test_generated_expressions_in_plans(tmp_path_factory, which, expr, pick):
    doc = copy.deepcopy(DOCS[PLANS[which]])
    slots = [(n, k) for n in doc["nodes"] for k in ("predicate", "condition", "expr")
             if isinstance(n.get(k), str)]
    slots += [(c, "expr") for n in doc["nodes"] for c in n.get("columns", []) +
              n.get("group_by", [])]
    slots += [(a["args"], i) for n in doc["nodes"] for a in n.get("aggregates", [])
              for i in range(len(a["args"]))]
    if not slots:
        return
    holder, key = slots[pick % len(slots)]
    holder[key] = expr
    d = tmp_path_factory.mktemp("expr")
    new = d / "new.json"
    new.write_text(json.dumps(doc), encoding="utf-8", errors="surrogatepass")
    _seen(_run("check", str(PLANS[which]), str(new), "--format", "json"))


_SQL_SALT = st.one_of(st.sampled_from(_TOKENS + _ODD + [
    "(" * 2000, ")" * 50, ";", ";;", "SELECT", "FROM", "WHERE", "GROUP BY", "JOIN", "ON",
    "UNION ALL", "CREATE TABLE", "INSERT INTO", "SET", "OPTIONS (partitions 99999999999)",
    "OPTIONS (partitions 1e308)", "OPTIONS (partitions " + "9" * 5000 + ")",
    "SET spark.sql.shuffle.partitions = 99999999999;", "/*+ DEDUP_WITHIN('x') */",
    "window(ts, '1e400 minutes')", "session_window(ts, '-1 second')", "LATERAL VIEW",
    "ROW_NUMBER() OVER (PARTITION BY x ORDER BY ts)", "'unterminated", "`unterminated"]),
    EXPRESSIONS)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A git repository whose HEAD holds plans/a.json and plans/b.json."""
    root = tmp_path_factory.mktemp("repo")
    (root / "plans").mkdir()
    for name, src in (("a.json", PLANS[0]), ("b.json", PLANS[1])):
        (root / "plans" / name).write_bytes(src.read_bytes())

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.email=f@z", "-c", "user.name=f", *args], cwd=root,
                       check=True, capture_output=True)

    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "base")
    return root


@_settings(15)
@given(which=st.integers(0, 1), picks=_PICKS, fmt=st.sampled_from(FORMATS),
       delete=st.booleans())
def test_against_a_git_ref(repo, which, picks, fmt, delete):
    name = ("a.json", "b.json")[which]
    target = repo / "plans" / name
    here = os.getcwd()
    try:
        if delete:
            target.unlink()
        else:
            target.write_text(mutate(DOCS[PLANS[which]], picks), encoding="utf-8",
                              errors="surrogatepass")
        os.chdir(repo)
        _seen(_run("check", "--against", "HEAD", "plans", "--format", fmt))
    finally:
        os.chdir(here)
        target.write_bytes(PLANS[which].read_bytes())


_SQL_TOKEN = re.compile(r"'[^']*'|\w+|[^\s\w]")
_SQL_SALT = st.one_of(_SQL_SALT, st.sampled_from(_TYPES))


@_settings(150)
@given(which=st.integers(0, len(SQLS) - 1), edits=st.lists(st.tuples(
    st.integers(0, 10**6), st.integers(0, 40), st.sampled_from(["insert", "delete",
                                                                "replace", "dup", "token",
                                                                "token", "token"]),
    _SQL_SALT), min_size=1, max_size=4))
def test_mutated_sql_compiles_or_is_one_error(tmp_path_factory, which, edits):
    text = TEXTS[SQLS[which]]
    for pos, length, action, salt in edits:
        at = pos % (len(text) + 1)
        if action == "token":  # one word, number or string replaced: mostly still SQL
            tokens = list(_SQL_TOKEN.finditer(text))
            m = tokens[pos % len(tokens)]
            swap = salt if length % 3 else tokens[length % len(tokens)].group()
            text = text[:m.start()] + swap + text[m.end():]
        elif action == "insert":
            text = text[:at] + " " + salt + " " + text[at:]
        elif action == "delete":
            text = text[:at] + text[at + length:]
        elif action == "replace":
            text = text[:at] + salt + text[at + length:]
        else:
            text = text[:at] + text[at:at + length] + text[at:]
    d = tmp_path_factory.mktemp("sql")
    q = d / "q.sql"
    q.write_text(text, encoding="utf-8", errors="surrogatepass")
    _seen(_run("plan", "compile", str(q), "-o", str(d / "out.json")))


@_settings(60)
@given(data=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(
    lambda s: s.encode("utf-8", "surrogatepass"))), command=st.sampled_from(
    ["check", "validate", "compile"]))
def test_raw_bytes(tmp_path_factory, data, command):
    d = tmp_path_factory.mktemp("raw")
    p = d / ("x.sql" if command == "compile" else "x.json")
    p.write_bytes(data)
    if command == "check":
        _run("check", str(PLANS[0]), str(p))
    elif command == "validate":
        _run("plan", "validate", str(p))
    else:
        _run("plan", "compile", str(p))


@pytest.mark.parametrize("name, content", [
    ("empty", b""),
    ("bom", b"\xef\xbb\xbf" + PLANS[0].read_bytes()),
    ("utf16", PLANS[0].read_text().encode("utf-16")),
    ("nul_bytes", b"\x00" * 10_000),
    ("open_brackets", b"[" * 5_000_000),
    ("huge_array", b'{"format": "theseus.plan/1", "query": "q", "nodes": [' +
     b",".join([b'{"id": "a", "step": "filter"}'] * 200_000) + b"]}"),
    ("huge_string", b'{"format": "theseus.plan/1", "query": "' + b"q" * 20_000_000 +
     b'", "nodes": []}'),
    ("huge_number", b'{"query": ' + b"7" * 1_000_000 + b"}"),
    ("deep_objects", b'{"a":' * 100_000 + b"1" + b"}" * 100_000),
])
def test_enormous_and_broken_files(tmp_path, name, content):
    p = tmp_path / f"{name}.json"
    p.write_bytes(content)
    _run("check", str(PLANS[0]), str(p))
    q = tmp_path / f"{name}.sql"
    q.write_bytes(content)
    _run("plan", "compile", str(q))


def test_a_directory_and_a_missing_file(tmp_path):
    _run("check", str(tmp_path), str(PLANS[0]))
    _run("check", str(PLANS[0]), str(tmp_path / "missing.json"))
    _run("plan", "compile", str(tmp_path))
    _run("plan", "compile", str(tmp_path / "missing.sql"))
    _run("plan", "show", str(Path("/dev/null")))
