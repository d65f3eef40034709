"""Validation of plan documents against ``schemas/plan.v1.json``.

The happy path must be fast (a 20,000-node plan is checked in a few times the cost of
``json.load``) and must not pay for importing ``jsonschema``.  So the schema is compiled once
into plain Python predicates covering the keywords it uses; only when a document fails are
the reference ``jsonschema`` validator (draft 2020-12) and its best-match error consulted, to
name the JSON pointer and say what was expected.  A test checks that both agree.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from compat.errors import PlanError

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"
if not SCHEMA_DIR.is_dir():  # installed without the repository around it
    SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"

Check = Callable[[Any], bool]


@lru_cache(maxsize=None)
def load_schema(name: str) -> dict[str, Any]:
    with open(SCHEMA_DIR / name, encoding="utf-8") as f:
        return json.load(f)


_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


class _Compiler:
    """Compiles the subset of JSON Schema 2020-12 that Theseus' schemas use."""

    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self.refs: dict[str, Check] = {}

    def ref(self, ref: str) -> Check:
        if ref not in self.refs:
            holder: list[Check] = []
            self.refs[ref] = lambda v: holder[0](v)  # late binding allows recursion
            target: Any = self.root
            for part in ref.lstrip("#/").split("/"):
                target = target[part]
            holder.append(self.compile(target))
        return self.refs[ref]

    def compile(self, s: Any) -> Check:  # noqa: C901 - one branch per keyword
        if s is True or s == {}:
            return lambda v: True
        if s is False:
            return lambda v: False
        checks: list[Check] = []
        if "$ref" in s:
            checks.append(self.ref(s["$ref"]))
        if "type" in s:
            checks.append(_TYPES[s["type"]])
        if "const" in s:
            const = s["const"]
            checks.append(lambda v, c=const: v == c and type(v) is type(c))
        if "enum" in s:
            allowed = frozenset(s["enum"])
            checks.append(lambda v: isinstance(v, str) and v in allowed)
        if "pattern" in s:
            rx = re.compile(s["pattern"])
            checks.append(lambda v: not isinstance(v, str) or rx.search(v) is not None)
        if "minLength" in s:
            n = s["minLength"]
            checks.append(lambda v: not isinstance(v, str) or len(v) >= n)
        if "minimum" in s:
            m = s["minimum"]
            checks.append(lambda v: not isinstance(v, (int, float)) or v >= m)
        if "minItems" in s:
            n = s["minItems"]
            checks.append(lambda v: not isinstance(v, list) or len(v) >= n)
        if "items" in s:
            item = self.compile(s["items"])
            checks.append(lambda v: not isinstance(v, list) or all(item(x) for x in v))
        if "required" in s:
            req = tuple(s["required"])
            checks.append(lambda v: not isinstance(v, dict) or all(k in v for k in req))
        if any(k in s for k in ("properties", "additionalProperties", "patternProperties")):
            checks.append(self._object(s))
        if "allOf" in s:
            checks.append(self._all_of(s["allOf"]))
        if len(checks) == 1:
            return checks[0]
        return lambda v: all(c(v) for c in checks)

    def _object(self, s: dict[str, Any]) -> Check:
        props = {k: self.compile(v) for k, v in s.get("properties", {}).items()}
        patterns = [(re.compile(p), self.compile(v))
                    for p, v in s.get("patternProperties", {}).items()]
        extra = s.get("additionalProperties", True)
        extra_check = self.compile(extra)

        def check(v: Any) -> bool:
            if not isinstance(v, dict):
                return True
            for key, value in v.items():
                c = props.get(key)
                if c is not None:
                    if not c(value):
                        return False
                    continue
                matched = False
                for rx, pc in patterns:
                    if rx.search(key):
                        matched = True
                        if not pc(value):
                            return False
                if not matched and not extra_check(value):
                    return False
            return True

        return check

    def _all_of(self, branches: list[Any]) -> Check:
        # ``allOf`` of ``if step == X then ...`` branches becomes one dispatch on ``step``.
        dispatch: dict[Any, Check] = {}
        rest: list[Check] = []
        for b in branches:
            cond = b.get("if", {}).get("properties", {})
            if len(b) == 2 and "then" in b and len(cond) == 1:
                (field, spec), = cond.items()
                if set(spec) == {"const"}:
                    dispatch[(field, spec["const"])] = self.compile(b["then"])
                    continue
            rest.append(self.compile(b))
        fields = {f for f, _ in dispatch}

        def check(v: Any) -> bool:
            if isinstance(v, dict):
                for f in fields:
                    c = dispatch.get((f, v.get(f)))
                    if c is not None and not c(v):
                        return False
            return all(r(v) for r in rest)

        return check


@lru_cache(maxsize=None)
def compiled(name: str) -> Check:
    schema = load_schema(name)
    return _Compiler(schema).compile(schema)


def pointer(path: Any) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def validate(doc: Any, name: str, file: str) -> None:
    """Raise one PlanError naming the file, node and JSON pointer if ``doc`` is invalid."""
    if compiled(name)(doc):
        return
    raise explain(doc, name, file)


def explain(doc: Any, name: str, file: str) -> PlanError:
    import jsonschema  # only on the error path: importing it costs more than a check

    schema = load_schema(name)
    validator = jsonschema.Draft202012Validator(schema)
    errors = list(validator.iter_errors(doc))
    if not errors:  # pragma: no cover - the compiled check and jsonschema disagree
        return PlanError("document rejected by the compiled schema check but accepted by "
                         "jsonschema; please report this", file=file, pointer="")
    err = _deepest(errors)
    path = list(err.absolute_path)
    node = _node_id(doc, path)
    ptr = pointer(path)
    # An unknown step: say the closest known name.
    if path[-1:] == ["step"] and err.validator == "enum":
        steps = err.validator_value
        found = err.instance
        close = difflib.get_close_matches(str(found), steps, n=1, cutoff=0.5)
        hint = f"Did you mean '{close[0]}'?" if close else None
        return PlanError(f"unknown step '{found}'", file=file, node=node, pointer=ptr,
                         expected="one of " + ", ".join(steps), found=repr(found), hint=hint)
    if err.validator == "additionalProperties":
        allowed = list(err.schema.get("properties", {}))
        extras = [k for k in err.instance if k not in allowed and not k.startswith("x-")]
        key = extras[0] if extras else "?"
        close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
        return PlanError(f"unknown field '{key}'", file=file, node=node,
                         pointer=ptr + "/" + key, expected="one of " + ", ".join(allowed),
                         found=repr(key), hint=f"Did you mean '{close[0]}'?" if close else None)
    if err.validator == "required":
        missing = [k for k in err.validator_value if k not in err.instance]
        return PlanError(f"missing required field '{missing[0]}'", file=file, node=node,
                         pointer=ptr, expected=f"field '{missing[0]}'", found="no such field")
    expected = _expected(err)
    found = json.dumps(err.instance)[:80]
    return PlanError("invalid value", file=file, node=node, pointer=ptr, expected=expected,
                     found=found)


def _deepest(errors: list[Any]) -> Any:
    best = None
    for e in errors:
        for leaf in _leaves(e):
            if best is None or len(leaf.absolute_path) > len(best.absolute_path):
                best = leaf
    return best


def _leaves(e: Any) -> list[Any]:
    if e.context:
        return [leaf for c in e.context for leaf in _leaves(c)]
    return [e]


def _expected(err: Any) -> str:
    v, val = err.validator, err.validator_value
    if v == "type":
        return f"a value of type {val}"
    if v == "enum":
        return "one of " + ", ".join(map(str, val))
    if v == "const":
        return json.dumps(val)
    if v == "pattern":
        return f"a string matching {val}"
    if v == "minimum":
        return f"a number >= {val}"
    if v == "minItems":
        return f"at least {val} item(s)"
    if v == "minLength":
        return "a non-empty string"
    return f"{v} {json.dumps(val)[:60]}"


def _node_id(doc: Any, path: list[Any]) -> str | None:
    node = None
    cur = doc
    for i, part in enumerate(path):
        try:
            cur = cur[part]
        except (KeyError, IndexError, TypeError):
            break
        if i > 0 and path[i - 1] in ("nodes", "body") and isinstance(cur, dict):
            node = cur.get("id") if isinstance(cur.get("id"), str) else node
    return node
