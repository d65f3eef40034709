"""Every registered step type is complete: its fields round-trip through the serde (every
field, ``description`` and ``x-*`` keys included) and the plan schema accepts them; it
registers every per-step behaviour (``REGISTRATIONS``: inference, compatibility rule, Spark
builder, column demand, Spark's filter movement, sharing signature, predicate pushdown,
PySpark export); the committed schema is the
one the classes generate; fixtures use it.  A new step type that misses one of these fails
here."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any

import jsonschema
import pytest

from compat import schema_check, serde
from compat.demand import moves_filter, reads
from compat.infer import infer_step
from compat.model import (
    DURATION,
    EXPR,
    ID,
    STEPS,
    Node,
    field_meta,
    required,
    step_fields,
)
from compat.plan_schema import plan_schema
from compat.pushdown import push_through
from compat.pyspark_text import export_step
from compat.rules import compare
from compat.signing import sign_step
from migrate.build import build_step
from tests.conftest import FIXTURES, UPGRADES

SCHEMA = schema_check.load_schema("plan.v1.json")
NODE_OK = schema_check.compiled("plan.v1.json", "#/$defs/node")
REFERENCE = jsonschema.Draft202012Validator(SCHEMA)

#: what every step type registers, each against its class with the singledispatch root named
#: (a step no job or optimizer can serve registers that refusal too: nothing falls back)
REGISTRATIONS = {
    "inference (@infer_step.register)": infer_step,
    "compatibility rule (@compare.register)": compare,
    "column demand (@reads.register)": reads,
    "filter movement in Spark's optimizer (@moves_filter.register)": moves_filter,
    "Spark builder (@build_step.register)": build_step,
    "sharing signature (@sign_step.register)": sign_step,
    "predicate pushdown (@push_through.register)": push_through,
    "PySpark export (@export_step.register, or refuse)": export_step,
}

#: steps no query-test fixture runs, and why
NOT_RUN = {"recursive": "checked but cannot run yet",
           "stop_gate": "inserted by the migrator, never in a user's plan",
           "start_gate": "inserted by the migrator, never in a user's plan"}


def _sample(t: Any, meta: dict[str, Any], default: Any, name: str) -> Any:
    """A value of type ``t`` that differs from ``default`` and fits the field's schema."""
    origin = typing.get_origin(t)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in typing.get_args(t) if a is not type(None)]
        return _sample(inner, meta, dataclasses.MISSING, name)
    if origin is tuple:
        item = typing.get_args(t)[0]
        if item is Node:
            return (STEPS["filter"](id="b1", inputs=("loop",), predicate="x > 1"),)
        item_meta = {"schema": meta.get("items")}
        return tuple(_sample(item, item_meta, dataclasses.MISSING, f"{name}{i}")
                     for i in range(2))
    if dataclasses.is_dataclass(t):
        return _instance(t)
    schema = meta.get("schema") or {}
    if t is bool:
        return not default if isinstance(default, bool) else True
    if t is int:
        return max(schema.get("minimum", 0), default if isinstance(default, int) else 0) + 2
    if "enum" in schema:
        return next(v for v in schema["enum"] if v != default)
    if schema is DURATION:
        return "7 minutes"
    if schema is EXPR:
        return f"{name} + 1"
    if schema is ID:
        return f"id_{name}"
    return f"v_{name}"


def _instance(cls: type) -> Any:
    hints = typing.get_type_hints(cls)
    fields = step_fields(cls) if issubclass(cls, Node) else dataclasses.fields(cls)
    kw = {f.name: _sample(hints[f.name], field_meta(f),
                          None if required(f) else f.default, f.name) for f in fields}
    if issubclass(cls, Node):
        kw.update(id="n1", inputs=("a", "b")[:max(cls.min_inputs, 1)] if cls.max_inputs != 0
                  else (), version=cls.max_version, description="what this step is for",
                  extras={"x-owner": {"team": ["ops"]}})
    return cls(**kw)


@pytest.mark.parametrize("name", sorted(STEPS))
def test_every_field_round_trips_and_the_schema_accepts_it(name):
    node = _instance(STEPS[name])
    doc = serde.node_doc(node)
    keys = {field_meta(f).get("key") or f.name for f in step_fields(STEPS[name])}
    assert keys | {"id", "step", "version", "description", "x-owner"} <= set(doc), \
        "a field at a value other than its default must be written"
    assert NODE_OK(doc) and REFERENCE.is_valid({"format": "theseus.plan/1", "query": "q",
                                               "nodes": [doc, doc]}), doc
    again = serde.node_from_doc(json.loads(json.dumps(doc)))
    assert again == node
    assert (again.description, again.extras) == (node.description, node.extras)
    assert serde.node_doc(again) == doc


def _missing(cls: type[Node]) -> list[str]:
    """The registrations ``cls`` lacks (one registered for a base class does not count)."""
    return [what for what, root in REGISTRATIONS.items() if cls not in root.registry]


@pytest.mark.parametrize("name", sorted(STEPS))
def test_every_step_registers_every_behaviour(name):
    cls = STEPS[name]
    assert not _missing(cls), f"step {name} registers no {', '.join(_missing(cls))}"
    assert cls.__doc__, f"step {name} needs a docstring: the plan schema describes it with it"


def test_a_step_type_without_registrations_misses_every_one():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Sample(Node):  # no ``step`` name: it stays out of STEPS
        """Keeps a sample of the rows."""

    assert _missing(Sample) == list(REGISTRATIONS)
    with pytest.raises(NotImplementedError, match="no PySpark export"):
        export_step(Sample(id="s"), None)
    with pytest.raises(NotImplementedError, match="no predicate pushdown"):
        push_through(Sample(id="s"), None, None)
    with pytest.raises(NotImplementedError, match="no sharing signature"):
        sign_step(Sample(id="s"), [], (), None)


def test_the_committed_schema_is_the_generated_one():
    assert SCHEMA == plan_schema(), "compat/schemas/plan.v1.json is stale: run " \
        "python scripts/gen_plan_schema.py"
    assert set(SCHEMA["$defs"]["node"]["properties"]["step"]["enum"]) == set(STEPS)


def test_every_step_has_fixtures():
    in_upgrades: set[str] = set()
    for case in UPGRADES:
        for side in ("old.json", "new.json"):
            for n in json.loads((case / side).read_text())["nodes"]:
                in_upgrades.add(n["step"])
                in_upgrades.update(b["step"] for b in n.get("body", []))
    in_qtt = {n["step"] for p in (FIXTURES / "qtt").glob("*/plan.json")
              for n in json.loads(p.read_text())["nodes"]}
    assert set(STEPS) <= in_upgrades, set(STEPS) - in_upgrades
    assert set(STEPS) - set(NOT_RUN) <= in_qtt, set(STEPS) - set(NOT_RUN) - in_qtt


def test_an_unknown_step_is_refused_with_the_closest_name(write_plan):
    from compat.errors import PlanError
    from compat.model import step_class

    with pytest.raises(PlanError, match="Did you mean 'aggregate'"):
        step_class("agregate")


# -- step versions: a version this build does not know is refused ----------------------------

def _version_refused(write_plan, doc: dict, pointer: str, *needles: str) -> None:
    from click.testing import CliRunner

    from migrate.cli import main

    path = write_plan(doc)
    result = CliRunner().invoke(main, ["check", path, path])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for n in (pointer, *needles):
        assert n in result.output, (n, result.output)


@pytest.mark.parametrize("step,version,known", [("filter", 2, "expected version 1 of"),
                                                ("aggregate", 7, "versions 1 to 2"),
                                                ("source", 5, "versions 1 to 4"),
                                                ("sink", 3, "versions 1 to 2")])
def test_a_step_version_above_the_highest_known_is_refused(write_plan, step, version, known):
    doc = json.loads((UPGRADES[0] / "old.json").read_text())
    i, node = next((i, n) for i, n in enumerate(doc["nodes"]) if n["step"] == step)
    node["version"] = version
    _version_refused(write_plan, doc, f"/nodes/{i}/version", f"node '{node['id']}'",
                     known, f"found version {version}", "newer Theseus")


def test_a_body_step_version_above_the_highest_known_is_refused(write_plan):
    doc = json.loads((FIXTURES / "upgrades" / "recursive_body_changed" / "old.json")
                     .read_text())
    i, rec = next((i, n) for i, n in enumerate(doc["nodes"]) if n["step"] == "recursive")
    rec["body"][0]["version"] = 2
    _version_refused(write_plan, doc, f"/nodes/{i}/body/0/version", "expected version 1")


def test_every_known_version_loads():
    for name, cls in STEPS.items():
        assert cls.max_version >= 1, name
    assert (STEPS["source"].max_version, STEPS["sink"].max_version,
            STEPS["recursive"].max_version, STEPS["aggregate"].max_version,
            STEPS["join"].max_version) == (4, 2, 2, 2, 3)
