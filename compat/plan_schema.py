"""``compat/schemas/plan.v1.json``, generated from the step classes.

Each step's JSON Schema follows its dataclass fields (``compat.model.prop``): a field
without a default is required; strings, integers and booleans take the schema the field
declares; tuples become arrays of their items; value types (columns, windows...) become
objects, shared under ``$defs`` when the class names a ``schema_def``; a recursive step's
body is an array of nodes.  Descriptions come from the classes' docstrings.

``python scripts/gen_plan_schema.py`` writes the file; a test fails when the committed file
differs from what this module generates.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from typing import Any

import compat.steps  # noqa: F401  (registers every step type)
from compat.model import (
    ID,
    PARTITIONS,
    STEPS,
    Node,
    field_meta,
    json_key,
    required,
    step_fields,
)

SCHEMA_ID = "https://theseus.dev/schemas/plan.v1.json"


def plan_schema() -> dict[str, Any]:
    defs: dict[str, Any] = {}
    steps = {name: _step(cls, defs) for name, cls in sorted(STEPS.items())}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "Theseus execution plan, format theseus.plan/1",
        "description": "A query as a graph of steps, from Kafka sources to one Kafka sink. "
                       "Expressions are Spark SQL expression strings; types are Spark SQL "
                       "type strings.",
        "type": "object",
        "required": ["format", "query", "nodes"],
        "additionalProperties": False,
        "patternProperties": {"^x-": {}},
        "properties": {
            "format": {"const": "theseus.plan/1"},
            "query": {"type": "string", "pattern": "^[A-Za-z0-9_.-]+$"},
            "config": {"type": "object", "additionalProperties": True,
                       "properties": {"state_partitions": {
                           **PARTITIONS,
                           "description": "Spark's shuffle partition count, which a "
                                          "checkpoint fixes forever"}}},
            "metadata": {"type": "object"},
            "nodes": {"type": "array", "minItems": 2, "items": {"$ref": "#/$defs/node"}},
        },
        "$defs": {
            **dict(sorted(defs.items())),
            "node": {
                "type": "object",
                "required": ["step"],
                "properties": {"step": {"enum": sorted(STEPS)}},
                "allOf": [{"if": {"properties": {"step": {"const": name}}},
                           "then": {"$ref": f"#/$defs/step_{name}"}} for name in steps],
            },
            **{f"step_{name}": s for name, s in steps.items()},
        },
    }


def _doc(cls: type) -> str:
    return " ".join(inspect.cleandoc(cls.__doc__ or "").split())


def _step(cls: type[Node], defs: dict[str, Any]) -> dict[str, Any]:
    with_inputs = cls.max_inputs != 0
    props: dict[str, Any] = {
        "id": ID,
        "step": {"type": "string"},
        "version": {"type": "integer", "minimum": 1},
        "description": {"type": "string"},
    }
    if with_inputs:
        props["inputs"] = {"type": "array", "items": ID, "minItems": 1}
    req = ["id", "step", "version"] + (["inputs"] if with_inputs else [])
    hints = typing.get_type_hints(cls)
    for f in step_fields(cls):
        props[json_key(f)] = _field(f, hints[f.name], defs)
        if required(f):
            req.append(json_key(f))
    return {"description": _doc(cls), "type": "object", "properties": props,
            "required": req, "patternProperties": {"^x-": {}}, "additionalProperties": False}


def _field(f: dataclasses.Field, t: Any, defs: dict[str, Any]) -> dict[str, Any]:
    meta = field_meta(f)
    out = _type(t, meta, defs)
    if meta.get("min_items") is not None:
        out["minItems"] = meta["min_items"]
    if meta.get("doc"):
        out["description"] = meta["doc"]
    return out


def _type(t: Any, meta: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    origin = typing.get_origin(t)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in typing.get_args(t) if a is not type(None)]
        return _type(inner, meta, defs)
    if origin is tuple:
        item = typing.get_args(t)[0]
        if item is Node:
            items: dict[str, Any] = {"$ref": "#/$defs/node"}
        elif meta.get("items") is not None:
            items = dict(meta["items"])
        else:
            items = _type(item, {}, defs)
        return {"type": "array", "items": items}
    if dataclasses.is_dataclass(t):
        return _object(t, defs)
    if meta.get("schema") is not None:
        return dict(meta["schema"])
    return {"type": {str: "string", int: "integer", bool: "boolean"}[t]}


def _object(cls: type, defs: dict[str, Any]) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    schema = {"type": "object",
              "required": [json_key(f) for f in fields if required(f)],
              "additionalProperties": False,
              "properties": {json_key(f): _field(f, hints[f.name], defs) for f in fields}}
    if _doc(cls):
        schema = {"description": _doc(cls), **schema}
    name = getattr(cls, "schema_def", None)
    if name is None:
        return schema
    defs[name] = schema
    return {"$ref": f"#/$defs/{name}"}
