"""Serialization round trip of every fixture plan, and agreement between the compiled
schema check (the fast path) and the reference jsonschema validator."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compat import schema_check, serde
from tests.conftest import PLAN_FILES, load_doc


def _norm(doc):
    """Drop the defaults that to_doc leaves out, for comparison (descriptions stay)."""
    doc = copy.deepcopy(doc)
    for n in doc["nodes"]:
        for node in [n] + n.get("body", []):
            if node.get("starting_offsets") == "earliest":
                del node["starting_offsets"]
            for c in node.get("schema", []):
                if c.get("nullable") is True:
                    del c["nullable"]
            for a in node.get("aggregates", []):
                if a.get("distinct") is False:
                    del a["distinct"]
            for o in node.get("order_by", []):
                if o.get("desc") is False:
                    del o["desc"]
            if node.get("outer") is False:
                del node["outer"]
    return doc


@pytest.mark.parametrize("path", PLAN_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_round_trip(path):
    doc = load_doc(path)
    plan = serde.from_doc(doc, str(path))
    again = serde.to_doc(plan)
    by_id = {n["id"]: n for n in _norm(doc)["nodes"]}
    assert {n["id"]: n for n in again["nodes"]} == by_id
    assert again["query"] == doc["query"]
    assert again.get("config", {}) == doc.get("config", {})
    # and the dump loads back to the same model
    assert serde.to_doc(serde.from_doc(json.loads(serde.dumps(plan)))) == again


def test_plan_schema_is_valid_draft_2020_12():
    jsonschema.Draft202012Validator.check_schema(schema_check.load_schema("plan.v1.json"))
    jsonschema.Draft202012Validator.check_schema(schema_check.load_schema("report.v1.json"))


REFERENCE = schema_check.reference("plan.v1.json")
FAST = schema_check.compiled("plan.v1.json")
SEEDS = [load_doc(p) for p in PLAN_FILES[:40]]

_values = st.one_of(st.none(), st.booleans(), st.integers(-3, 5), st.text(max_size=6),
                    st.sampled_from(["source", "filter", "json", "stream", "update",
                                     "theseus.plan/1", "1 minute", "x > 1"]),
                    st.lists(st.text(max_size=3), max_size=2), st.just({}),
                    # floats where integers belong, and integers beyond Java's int
                    st.sampled_from([3.0, 1e308, -0.0, 2**31 - 1, 2**31, 10**40]))


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, prefix + (i,))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, len(SEEDS) - 1), pick=st.integers(0, 10_000), value=_values,
       action=st.sampled_from(["set", "delete", "add_key"]))
def test_fast_validator_agrees_with_jsonschema(seed, pick, value, action):
    doc = copy.deepcopy(SEEDS[seed])
    paths = [p for p in _paths(doc) if p]
    path = paths[pick % len(paths)]
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if action == "set":
        parent[last] = value
    elif action == "delete":
        del parent[last]
    elif isinstance(parent, dict):
        parent["k" + str(value)[:3]] = value
    assert FAST(doc) == REFERENCE.is_valid(doc)


def test_descriptions_and_x_keys_round_trip(write_plan):
    doc = load_doc(PLAN_FILES[0])
    doc["nodes"][0]["description"] = "where the packages come from"
    doc["nodes"][1]["x-owner"] = {"team": "fleet", "pager": ["a", "b"]}
    doc["x-review"] = "ok"
    plan = serde.load(write_plan(doc))
    again = serde.to_doc(plan)
    assert again["nodes"][0]["description"] == "where the packages come from"
    assert again["nodes"][1]["x-owner"] == {"team": "fleet", "pager": ["a", "b"]}
    assert again["x-review"] == "ok"


def test_a_description_changes_nothing_the_checker_sees(write_plan):
    from compat.check import check_files

    doc = load_doc(PLAN_FILES[0])
    described = copy.deepcopy(doc)
    described["nodes"][3]["description"] = "total weight per ship"
    assert check_files(write_plan(doc), write_plan(described)).verdict == "identical"
