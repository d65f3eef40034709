"""Writes schemas/plan.v1.json.  The schema is data; this script only saves typing the
common node properties into every step definition.  Run: python scripts/gen_plan_schema.py"""

from __future__ import annotations

import json
from pathlib import Path

ID = {"type": "string", "pattern": "^[A-Za-z0-9_.-]+$", "minLength": 1}
EXPR = {"type": "string", "minLength": 1}
TYPE = {"type": "string", "minLength": 1}
DURATION = {"type": "string", "pattern": r"^\s*\d+(\.\d+)?\s*[A-Za-z]+\s*$"}
NAMES = {"type": "array", "items": {"type": "string", "minLength": 1}}

COMMON = {
    "id": ID,
    "step": {"type": "string"},
    "version": {"type": "integer", "minimum": 1},
    "inputs": {"type": "array", "items": ID, "minItems": 1},
    "description": {"type": "string"},
}


def step(name, props, required=(), with_inputs=True):
    p = dict(COMMON)
    if not with_inputs:
        del p["inputs"]
    p.update(props)
    req = ["id", "step", "version"] + (["inputs"] if with_inputs else []) + list(required)
    return {"type": "object", "properties": p, "required": req,
            "patternProperties": {"^x-": {}}, "additionalProperties": False}


column = {"type": "object", "required": ["name", "type"], "additionalProperties": False,
          "properties": {"name": {"type": "string", "minLength": 1}, "type": TYPE,
                         "nullable": {"type": "boolean"}}}
named_expr = {"type": "object", "required": ["name", "expr"], "additionalProperties": False,
              "properties": {"name": {"type": "string", "minLength": 1}, "expr": EXPR}}

STEPS = {
    "source": step("source", {
        "topic": {"type": "string", "minLength": 1},
        "partitions": {"type": "integer", "minimum": 1},
        "format": {"enum": ["json", "string"]},
        "schema": {"type": "array", "items": {"$ref": "#/$defs/column"}, "minItems": 1},
        "key_columns": NAMES,
        "role": {"enum": ["stream", "table"]},
        "event_time": {"type": "object", "required": ["column", "watermark"],
                       "additionalProperties": False,
                       "properties": {"column": {"type": "string"}, "watermark": DURATION}},
        "starting_offsets": {"enum": ["earliest", "latest"]},
    }, ["topic", "partitions", "format", "schema", "role"], with_inputs=False),
    "filter": step("filter", {"predicate": EXPR}, ["predicate"]),
    "project": step("project", {"columns": {"type": "array", "minItems": 1,
                                            "items": {"$ref": "#/$defs/named_expr"}}},
                    ["columns"]),
    "explode": step("explode", {"expr": EXPR, "as": {"type": "string", "minLength": 1},
                                "outer": {"type": "boolean"}}, ["expr", "as"]),
    "union": step("union", {}),
    "aggregate": step("aggregate", {
        "group_by": {"type": "array", "items": {"$ref": "#/$defs/named_expr"}},
        "aggregates": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["name", "function", "args"],
            "additionalProperties": False,
            "properties": {"name": {"type": "string", "minLength": 1},
                           "function": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                           "args": {"type": "array", "items": EXPR},
                           "distinct": {"type": "boolean"}}}},
        "window": {"type": "object", "required": ["type", "column", "size"],
                   "additionalProperties": False,
                   "properties": {"type": {"enum": ["tumbling", "hopping", "session"]},
                                  "column": {"type": "string"}, "size": DURATION,
                                  "slide": DURATION, "gap": DURATION}},
    }, ["group_by", "aggregates"]),
    "join": step("join", {
        "type": {"enum": ["inner", "left", "right", "full", "left_semi", "left_anti"]},
        "left_keys": {"type": "array", "items": EXPR},
        "right_keys": {"type": "array", "items": EXPR},
        "condition": EXPR,
        "time_bound": EXPR,
    }, ["type", "left_keys", "right_keys"]),
    "deduplicate": step("deduplicate", {"keys": {**NAMES, "minItems": 1}, "within": DURATION},
                        ["keys"]),
    "top_n": step("top_n", {
        "partition_by": {"type": "array", "items": EXPR},
        "order_by": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["expr"], "additionalProperties": False,
            "properties": {"expr": EXPR, "desc": {"type": "boolean"}}}},
        "n": {"type": "integer", "minimum": 1},
    }, ["partition_by", "order_by", "n"]),
    "recursive": step("recursive", {
        "body": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/node"}},
        "body_input": ID,
        "body_output": ID,
        "feedback": {"type": "object", "required": ["partitions"], "additionalProperties": False,
                     "properties": {"partitions": {"type": "integer", "minimum": 1}}},
    }, ["body", "body_input", "body_output", "feedback"]),
    "sink": step("sink", {
        "topic": {"type": "string", "minLength": 1},
        "format": {"enum": ["json", "string"]},
        "key_columns": NAMES,
        "mode": {"enum": ["append", "update", "complete"]},
        "delivery": {"enum": ["exactly_once", "at_least_once"]},
    }, ["topic", "format", "key_columns", "mode", "delivery"]),
    "stop_gate": step("stop_gate", {"migration": {"type": "string"}}),
    "start_gate": step("start_gate", {"migration": {"type": "string"}}),
}

schema = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://theseus.dev/schemas/plan.v1.json",
    "title": "Theseus execution plan, format theseus.plan/1",
    "type": "object",
    "required": ["format", "query", "nodes"],
    "additionalProperties": False,
    "patternProperties": {"^x-": {}},
    "properties": {
        "format": {"const": "theseus.plan/1"},
        "query": {"type": "string", "pattern": "^[A-Za-z0-9_.-]+$"},
        "config": {"type": "object", "additionalProperties": True,
                   "properties": {"state_partitions": {"type": "integer", "minimum": 1}}},
        "metadata": {"type": "object"},
        "nodes": {"type": "array", "minItems": 2, "items": {"$ref": "#/$defs/node"}},
    },
    "$defs": {
        "column": column,
        "named_expr": named_expr,
        "node": {
            "type": "object",
            "required": ["step"],
            "properties": {"step": {"enum": sorted(STEPS)}},
            "allOf": [{"if": {"properties": {"step": {"const": name}}},
                       "then": {"$ref": f"#/$defs/step_{name}"}} for name in sorted(STEPS)],
        },
        **{f"step_{name}": s for name, s in sorted(STEPS.items())},
    },
}

out = Path(__file__).resolve().parent.parent / "schemas" / "plan.v1.json"
out.write_text(json.dumps(schema, indent=2) + "\n")
print(f"wrote {out}")
