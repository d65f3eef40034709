"""The checker's work grows with the plans and the changes, never with their product.

No timing here: these tests count operations (expressions put in canonical form, keys
looked at by the path alignment, neighbour tables built) on generated chains of filters and
projects around an aggregate, the plan a new user writes first.  The old checker put every
passive step of a changed path in canonical form, ran ``difflib`` over the whole path and
searched the graph once per filter finding.
"""

from __future__ import annotations

import difflib
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compat import expr as E
from compat import walk as W
from compat.check import check_plans
from compat.infer import analyze
from compat.rules import moves as M
from compat.serde import from_doc

REGIONS = ("eu", "us", "apac")


def chain(n_passive: int, changed: set[int] = frozenset(), seed: int = 3) -> dict:
    """source -> filter/project... -> aggregate -> filter/project... -> sink; the k-th
    passive step gets a constant of its own when k is in ``changed``."""
    rng = random.Random(seed)
    schema = [{"name": "region", "type": "string"}, {"name": "amount", "type": "double"},
              {"name": "ts", "type": "timestamp"}]
    nodes = [{"id": "src", "step": "source", "version": 1, "topic": "t", "partitions": 1,
              "format": "json", "role": "stream", "schema": schema,
              "event_time": {"column": "ts", "watermark": "1 minute"}}]
    prev = "src"
    half = n_passive // 2
    for k in range(n_passive):
        if k == half:
            nodes.append({"id": "agg", "step": "aggregate", "version": 1, "inputs": [prev],
                          "group_by": [{"name": "region", "expr": "region"}],
                          "aggregates": [{"name": "amount", "function": "sum",
                                          "args": ["amount"]}]})
            prev = "agg"
        bound, factor, region = rng.randint(1, 10**6), rng.randint(2, 9), rng.choice(REGIONS)
        if k in changed:
            bound, factor = 10**7 + k, 1000 + k
        nid = f"n{k}"
        if k % 2 == 0:
            nodes.append({"id": nid, "step": "filter", "version": 1, "inputs": [prev],
                          "predicate": f"amount > {bound} AND region <> '{region}'"})
        else:
            cols = [{"name": "region", "expr": "region"},
                    {"name": "amount", "expr": f"amount * {factor}"}]
            if k < half:
                cols.append({"name": "ts", "expr": "ts"})
            nodes.append({"id": nid, "step": "project", "version": 1, "inputs": [prev],
                          "columns": cols})
        prev = nid
    nodes.append({"id": "out", "step": "sink", "version": 1, "inputs": [prev], "topic": "o",
                  "format": "json", "key_columns": ["region"], "mode": "update",
                  "delivery": "exactly_once"})
    return {"format": "theseus.plan/1", "query": "q", "config": {"state_partitions": 4},
            "nodes": nodes}


def _plan(doc):
    p = from_doc(doc)
    analyze(p)
    return p


class Counts:
    def __init__(self, monkeypatch):
        self.canonical = 0
        self.aligned = 0
        self.neighbour_tables = 0
        canonical, anchor_blocks, neighbours = E.canonical, W._anchor_blocks, M.neighbours

        def count_canonical(text):
            self.canonical += 1
            return canonical(text)

        def count_blocks(a, b, i1, i2, j1, j2, *rest):
            self.aligned += (i2 - i1) + (j2 - j1)
            return anchor_blocks(a, b, i1, i2, j1, j2, *rest)

        def count_neighbours(plan, down):
            self.neighbour_tables += 1
            return neighbours(plan, down)

        monkeypatch.setattr(E, "canonical", count_canonical)
        monkeypatch.setattr(W, "_anchor_blocks", count_blocks)
        monkeypatch.setattr(M, "neighbours", count_neighbours)


def check_counts(monkeypatch, n_passive: int, n_changed: int):
    changed = set(random.Random(n_passive + n_changed).sample(range(n_passive), n_changed))
    old, new = _plan(chain(n_passive)), _plan(chain(n_passive, changed))
    counts = Counts(monkeypatch)
    report = check_plans(old, new)
    monkeypatch.undo()
    codes = {f.code for f in report.findings}
    assert codes <= {"filter-changed", "project-changed"}, codes
    assert len(report.findings) == n_changed
    return counts


@pytest.mark.parametrize("n_passive,n_changed", [(400, 4), (6400, 4), (1600, 80),
                                                 (1600, 400)])
def test_work_follows_the_changes_not_the_plan(monkeypatch, n_passive, n_changed):
    c = check_counts(monkeypatch, n_passive, n_changed)
    # Only the steps inside a gap of the alignment are put in canonical form (an old and a
    # new one per change, a project's columns each, compared by the passive rule too),
    # whatever the length of the path; the old checker did every step of the path.
    assert c.canonical <= 20 * n_changed + 50
    # Each key of a path is looked at a bounded number of times (the whole path once,
    # then the gaps between anchors), however many steps changed.
    assert c.aligned <= 3 * 2 * n_passive
    # Nearest enforcing neighbours: one table per plan and direction, not a graph search
    # per filter finding.
    assert c.neighbour_tables <= 4


def test_moves_meet_through_the_aggregate_in_one_table(monkeypatch):
    """Many conjuncts moved across one aggregate: each pair is found, with one neighbour
    table per plan and direction (not one search per finding, nor every up x down pair)."""
    n = 200
    old_doc, new_doc = chain(n), chain(n)
    for doc, side in ((old_doc, "up"), (new_doc, "down")):
        for node in doc["nodes"]:
            k = int(node["id"][1:]) if node["id"][1:].isdigit() else -1
            if node["step"] == "filter" and (k < n // 2) == (side == "up"):
                node["predicate"] += f" AND region <> 'r{k % (n // 2)}'"
    counts = Counts(monkeypatch)
    report = check_plans(_plan(old_doc), _plan(new_doc))
    monkeypatch.undo()
    moved = [f for f in report.findings if f.code == "predicate-moved"]
    assert len(moved) == n // 4
    assert all(f.code == "predicate-moved" for f in report.findings)
    assert counts.neighbour_tables <= 4


def test_neighbours_match_a_search_from_each_node():
    from compat.model import ENFORCING

    def search(plan, nid, down):
        seen, todo = set(), [nid]
        while todo:
            cur = todo.pop()
            if cur in seen:
                continue
            seen.add(cur)
            for x in (plan.dependents.get(cur, []) if down else plan.nodes[cur].inputs):
                if plan.nodes[x].klass == ENFORCING:
                    return x
                todo.append(x)
        return None

    from tests.conftest import PLAN_FILES, load_doc

    for path in PLAN_FILES:
        plan = _plan(load_doc(path))
        for down in (True, False):
            table = M.neighbours(plan, down)
            assert table == {nid: search(plan, nid, down) for nid in plan.nodes}, path


# -- the alignment itself ----------------------------------------------------------------

def _valid(a, b, ops):
    i = j = 0
    for tag, i1, i2, j1, j2 in ops:
        assert (i1, j1) == (i, j)
        if tag == "equal":
            assert i2 - i1 == j2 - j1 > 0 and a[i1:i2] == b[j1:j2]
        else:
            assert {"replace": i2 > i1 and j2 > j1, "delete": i2 > i1 and j2 == j1,
                    "insert": j2 > j1 and i2 == i1}[tag]
        i, j = i2, j2
    assert (i, j) == (len(a), len(b))


@given(st.lists(st.integers(0, 6), max_size=30), st.lists(st.integers(0, 6), max_size=30))
def test_align_is_an_alignment(a, b):
    _valid(a, b, W.align(a, b))


def _matched(ops):
    return [(i, j) for tag, i1, i2, j1, j2 in ops if tag == "equal"
            for i, j in zip(range(i1, i2), range(j1, j2))]


@given(st.lists(st.integers(0, 10**6), unique=True, max_size=40), st.data())
def test_align_pairs_as_difflib_for_one_edit_of_distinct_steps(a, data):
    """A step changed, added, removed or moved, on a path of distinct steps: the same
    pairing as difflib's."""
    b = list(a)
    edit = data.draw(st.sampled_from(["change", "add", "remove", "move"]))
    if edit == "add" or not b:
        b.insert(data.draw(st.integers(0, len(b))), -1)
    elif edit == "change":
        b[data.draw(st.integers(0, len(b) - 1))] = -1
    elif edit == "remove":
        b.pop(data.draw(st.integers(0, len(b) - 1)))
    else:
        x = b.pop(data.draw(st.integers(0, len(b) - 1)))
        b.insert(data.draw(st.integers(0, len(b))), x)
    ops = W.align(a, b)
    _valid(a, b, ops)
    expected = difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes()
    assert _matched(ops) == _matched(expected)


def test_the_new_plan_infers_only_what_a_change_reaches(monkeypatch):
    """A changed filter changes no column: what follows it keeps its old info, so only the
    changed steps (and the sink, whose inference looks further than its input) are
    inferred again, wherever in the chain the change is."""
    from compat import infer as I
    from compat.serde import from_doc as load_doc

    old_doc, new_doc = chain(2000), chain(2000, {0, 1000, 1998})
    old = _plan(old_doc)
    calls = []
    infer_step = I.infer_step
    monkeypatch.setattr(I, "infer_step", lambda n, *a: calls.append(n.id) or infer_step(n, *a))
    new = load_doc(new_doc, reuse=old)
    analyze(new, old)
    assert sorted(calls) == ["n0", "n1000", "n1998", "out"]
    # and what was reused is what inferring again would give
    fresh = from_doc(new_doc)
    monkeypatch.setattr(I, "infer_step", infer_step)
    assert analyze(fresh) == new.info
