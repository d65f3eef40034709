"""Properties of the checker over every fixture plan:
- a plan compared with itself is identical;
- so is the same plan with every node id renamed, nodes shuffled, and every expression
  reformatted (case, spacing, commutative operands swapped);
- random mutations never crash: a report (exit 0/1/3) or one clear error (exit 2)."""

from __future__ import annotations

import copy
import json
import random
import re

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compat import expr as E
from compat.check import check_plans
from compat.errors import TheseusError
from compat.infer import analyze
from compat.serde import from_doc
from migrate.cli import main
from tests.conftest import PLAN_FILES, load_doc

DOCS = {p: load_doc(p) for p in PLAN_FILES}
UNIQUE = list({json.dumps(d, sort_keys=True): p for p, d in DOCS.items()}.values())

EXPR_FIELDS = {"predicate", "expr", "condition", "time_bound"}
EXPR_LISTS = {"left_keys", "right_keys", "partition_by"}


def _plan(doc, name="<plan>"):
    p = from_doc(doc, name)
    analyze(p)
    return p


def reformat(text: str, rng: random.Random) -> str:
    """Same expression, different text: swap commutative operands, change case, spacing."""
    ast = E.parse(text)
    if ast[0] == "opaque":
        return text

    def shuffle(node):
        if not isinstance(node, tuple) or not node:
            return node
        if node[0] == "bin" and node[1] in ("and", "or", "=", "+", "*") and rng.random() < .5:
            return ("bin", node[1], shuffle(node[3]), shuffle(node[2]))
        return tuple(shuffle(x) if isinstance(x, tuple) else x for x in node)

    out = E.render(shuffle(ast))
    # upper-case keywords and unquoted identifiers at random, outside string literals
    parts = re.split(r"('(?:[^'\\]|\\.)*')", out)
    for i in range(0, len(parts), 2):
        parts[i] = re.sub(r"[A-Za-z_]+", lambda m: m.group().upper()
                          if rng.random() < .5 else m.group(), parts[i])
        parts[i] = parts[i].replace(" ", rng.choice([" ", "  "]))
    return "".join(parts)


def rename_and_reformat(doc: dict, seed: int) -> dict:
    rng = random.Random(seed)
    doc = copy.deepcopy(doc)
    ids = {n["id"]: f"n{i}_{rng.randint(0, 999)}" for i, n in enumerate(doc["nodes"])}
    # A join names a clashing right column after its right input ('<right id>_<name>'):
    # renaming that input renames an output column, which is a real change (tested below).
    for n in doc["nodes"]:
        if n["step"] == "join":
            ids[n["inputs"][1]] = n["inputs"][1]
        # a recursive body reads its step's further inputs by their ids (and a body join
        # names clashing columns after them): renaming one is a change of the body
        if n["step"] == "recursive":
            ids.update({i: i for i in n["inputs"][1:]})

    def requalify(text):
        # qualifiers in join conditions name input ids
        ast = E.parse(text)
        if ast[0] == "opaque":
            return text

        def fix(node):
            if not isinstance(node, tuple) or not node:
                return node
            if node[0] == "col" and len(node[1]) > 1:
                for old, new in ids.items():
                    if node[1][0] == old.lower():
                        return ("col", (new.lower(),) + node[1][1:])
            return tuple(fix(x) if isinstance(x, tuple) else x for x in node)

        return E.render(fix(ast))

    for n in doc["nodes"]:
        n["id"] = ids[n["id"]]
        if "inputs" in n:
            n["inputs"] = [ids[i] for i in n["inputs"]]
        for k in list(n):
            if k in ("condition", "time_bound"):
                n[k] = reformat(requalify(n[k]), rng)
            elif k in EXPR_FIELDS:
                n[k] = reformat(n[k], rng)
            elif k in EXPR_LISTS:
                n[k] = [reformat(x, rng) for x in n[k]]
            elif k in ("columns", "group_by"):
                for c in n[k]:
                    c["expr"] = reformat(c["expr"], rng)
    rng.shuffle(doc["nodes"])
    doc["metadata"] = {"changed": seed}
    return doc


@pytest.mark.parametrize("path", UNIQUE, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_plan_against_itself_is_identical(path):
    report = check_plans(_plan(DOCS[path]), _plan(DOCS[path]))
    assert report.verdict == "identical", [f.message for f in report.findings]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.integers(0, len(UNIQUE) - 1), seed=st.integers(0, 10**6))
def test_renamed_and_reformatted_plan_is_identical(which, seed):
    doc = DOCS[UNIQUE[which]]
    other = rename_and_reformat(doc, seed)
    report = check_plans(_plan(doc), _plan(other))
    assert report.verdict == "identical", [f.message for f in report.findings]


_junk = st.one_of(st.none(), st.booleans(), st.integers(-2, 4), st.text(max_size=8),
                  st.sampled_from(["x > 1", "sum", "ts", "update", "append", "table",
                                   "1 minute", "payments", "reflect('a','b')"]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.integers(0, len(UNIQUE) - 1), picks=st.lists(
    st.tuples(st.integers(0, 10**6), _junk, st.booleans()), min_size=1, max_size=3))
def test_random_mutations_never_crash(which, picks, tmp_path_factory):
    doc = copy.deepcopy(DOCS[UNIQUE[which]])
    for pick, value, delete in picks:
        node = doc["nodes"][pick % len(doc["nodes"])]
        keys = sorted(node)
        key = keys[pick % len(keys)]
        if delete:
            node.pop(key)
        else:
            node[key] = value
    d = tmp_path_factory.mktemp("m")
    old, new = d / "old.json", d / "new.json"
    old.write_text(json.dumps(DOCS[UNIQUE[which]]))
    new.write_text(json.dumps(doc))
    result = CliRunner().invoke(main, ["check", str(old), str(new), "--format", "json"])
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        repr(result.exception)
    assert result.exit_code in (0, 1, 2, 3)
    if result.exit_code == 2:
        assert "new.json" in result.output and "Traceback" not in result.output
    else:
        json.loads(result.output)


def test_theseus_error_is_the_only_root():
    from compat import errors

    for name in dir(errors):
        obj = getattr(errors, name)
        if isinstance(obj, type) and issubclass(obj, Exception) and obj is not TheseusError:
            assert issubclass(obj, TheseusError)


def test_renaming_a_join_right_input_renames_clashing_output_columns():
    found = None
    for doc in DOCS.values():
        for n in doc["nodes"]:
            if n["step"] == "join":
                plan = _plan(doc)
                right = n["inputs"][1]
                if any(c.startswith(right.lower() + "_") for c, _ in plan.info[n["id"]].columns):
                    found = (doc, plan, right)
    assert found, "a fixture join with a clashing right column is expected"
    doc, plan, right = found
    other = json.loads(json.dumps(doc).replace(f'"{right}"', '"renamed_right"')
                       .replace(f"{right}.", "renamed_right."))
    report = check_plans(plan, _plan(other))
    assert "output-column-renamed" in {f.code for f in report.findings}
