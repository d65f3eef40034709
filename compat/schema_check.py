"""Validation of plan documents against ``compat/schemas/plan.v1.json``.

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
from functools import cache
from importlib import resources
from typing import Any

from compat.errors import PlanError

#: the JSON schemas (``compat/schemas/``), shipped with the package: read as resources, so
#: that they are found wherever and however Theseus is installed
SCHEMAS = resources.files("compat") / "schemas"

Check = Callable[[Any], bool]


@cache
def load_schema(name: str) -> dict[str, Any]:
    return json.loads((SCHEMAS / name).read_text(encoding="utf-8"))


class _CodeGen:
    """Compiles the subset of JSON Schema 2020-12 that Theseus' schemas use into Python
    source (one function per subschema, checks inlined), like fastjsonschema does."""

    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self.lines: list[str] = []
        self.names: dict[int, str] = {}
        self.consts: dict[str, Any] = {}
        self.refs: dict[str, str] = {}

    def const(self, value: Any) -> str:
        name = f"_k{len(self.consts)}"
        self.consts[name] = value
        return name

    def ref(self, ref: str) -> str:
        if ref not in self.refs:
            target: Any = self.root
            for part in ref.lstrip("#/").split("/"):
                target = target[part]
            self.refs[ref] = f"_f{len(self.refs) + len(self.names) + 1000}"
            self.function(target, self.refs[ref])
        return self.refs[ref]

    def function(self, s: Any, name: str | None = None) -> str:
        if name is None:
            if id(s) in self.names:
                return self.names[id(s)]
            if type(s) is dict and len(s) == 1 and "$ref" in s:
                # nothing but a reference: its target's function, without a call around it
                self.names[id(s)] = self.ref(s["$ref"])
                return self.names[id(s)]
            name = f"_f{len(self.names)}"
            self.names[id(s)] = name
        body: list[str] = []
        self.emit(s, "v", body, 1)
        self.lines.append(f"def {name}(v):")
        self.lines.extend(body or ["    pass"])
        self.lines.append("    return True")
        return name

    def emit(self, s: Any, var: str, out: list[str], depth: int) -> None:  # noqa: C901
        pad = "    " * depth
        if s is True or s == {}:
            return
        if s is False:
            out.append(f"{pad}return False")
            return
        if "$ref" in s:
            out.append(f"{pad}if not {self.ref(s['$ref'])}({var}): return False")
        t = s.get("type")
        if t == "object":
            out.append(f"{pad}if type({var}) is not dict: return False")
        elif t == "array":
            out.append(f"{pad}if type({var}) is not list: return False")
        elif t == "string":
            out.append(f"{pad}if type({var}) is not str: return False")
        elif t == "integer":
            out.append(f"{pad}if type({var}) is not int: return False")
        elif t == "boolean":
            out.append(f"{pad}if type({var}) is not bool: return False")
        elif t == "number":
            out.append(f"{pad}if type({var}) not in (int, float): return False")
        elif t is not None:
            raise NotImplementedError(t)
        # Past the type check, the checks of other keywords need not test the type again.
        is_str = "" if t == "string" else f"type({var}) is str and "
        is_num = "" if t in ("integer", "number") else f"type({var}) in (int, float) and "
        is_list = "" if t == "array" else f"type({var}) is list and "
        is_dict = "" if t == "object" else f"type({var}) is dict and "
        if "const" in s:
            k = self.const(s["const"])
            out.append(f"{pad}if {var} != {k} or type({var}) is not type({k}): return False")
        if "enum" in s:
            k = self.const(frozenset(s["enum"]))
            out.append(f"{pad}if type({var}) is not str or {var} not in {k}: return False")
        if "pattern" in s:
            k = self.const(re.compile(s["pattern"]).search)
            out.append(f"{pad}if {is_str}{k}({var}) is None: return False")
        if "minLength" in s:
            out.append(f"{pad}if {is_str}len({var}) < {s['minLength']}: return False")
        if "minimum" in s:
            out.append(f"{pad}if {is_num}{var} < {s['minimum']!r}: return False")
        if "maximum" in s:
            out.append(f"{pad}if {is_num}{var} > {s['maximum']!r}: return False")
        if "minItems" in s:
            out.append(f"{pad}if {is_list}len({var}) < {s['minItems']}: return False")
        if "items" in s and s["items"] not in (True, {}):
            f = self.function(s["items"])
            # all() stops at the first invalid item, as a loop returning False would
            out.append(f"{pad}if {is_list}not all(map({f}, {var})): return False")
        if "required" in s:
            for key in s["required"]:
                out.append(f"{pad}if {is_dict}{key!r} not in {var}: return False")
        if any(k in s for k in ("properties", "additionalProperties", "patternProperties")):
            self.emit_object(s, var, out, depth, known=t == "object")
        if "allOf" in s:
            self.emit_all_of(s["allOf"], var, out, depth, known=t == "object")

    def emit_object(self, s: dict[str, Any], var: str, out: list[str], depth: int,
                    known: bool = False) -> None:
        """``known``: ``var`` is known to be a dict here."""
        pad = "    " * depth
        props = {k: self.function(v) for k, v in s.get("properties", {}).items()}
        patterns = [(re.compile(p).search, self.function(v))
                    for p, v in s.get("patternProperties", {}).items()]
        extra = s.get("additionalProperties", True)
        extra_f = self.function(extra) if extra not in (True, {}) else None
        if not patterns and extra in (True, {}) and len(props) <= 3:
            # Only a few keys have a schema, any other is allowed: look those up rather
            # than go over every key (the result is the same: all checks must pass).
            is_dict = "" if known else f"type({var}) is dict and "
            for key, fn in props.items():
                out.append(f"{pad}if {is_dict}{key!r} in {var} and not {fn}({var}[{key!r}]): "
                           "return False")
            return
        if extra is False and known:
            self.emit_closed_object(s, var, out, depth, patterns)
            return
        table = self.const(props)  # filled with functions after exec
        out.append(f"{pad}if type({var}) is dict:")
        out.append(f"{pad}    for key, val in {var}.items():")
        out.append(f"{pad}        f = {table}.get(key)")
        out.append(f"{pad}        if f is not None:")
        out.append(f"{pad}            if not f(val): return False")
        out.append(f"{pad}            continue")
        self.emit_patterns(pad, patterns, out)
        if extra is False:
            out.append(f"{pad}        return False")
        elif extra_f:
            out.append(f"{pad}        if not {extra_f}(val): return False")
        self.tables = getattr(self, "tables", [])
        self.tables.append(table)

    def emit_patterns(self, pad: str, patterns: list[tuple[Any, str]], out: list[str]) -> None:
        """In the loop over an object's keys: a key matching a pattern is checked by the
        pattern's function (all that match), and the loop goes on to the next key."""
        if not patterns:
            return
        out.append(f"{pad}        matched = False")
        for search, fn in patterns:
            k = self.const(search)
            out.append(f"{pad}        if {k}(key):")
            out.append(f"{pad}            matched = True")
            out.append(f"{pad}            if not {fn}(val): return False")
        out.append(f"{pad}        if matched: continue")

    def emit_closed_object(self, s: dict[str, Any], var: str, out: list[str], depth: int,
                           patterns: list[tuple[Any, str]]) -> None:
        """An object (``var`` is a dict) whose keys are its properties and, failing that,
        match a pattern: every key without a property is looked at only when there is
        one, and each property's checks are written in place when they are a scalar's.
        The same checks as ``emit_object``'s loop, in another order (all must pass)."""
        pad = "    " * depth
        props = s.get("properties", {})
        keys = self.const(frozenset(props))
        out.append(f"{pad}if not ({var}.keys() <= {keys}):")
        out.append(f"{pad}    for key, val in {var}.items():")
        out.append(f"{pad}        if key in {keys}: continue")
        self.emit_patterns(pad, patterns, out)
        out.append(f"{pad}        return False")
        required = set(s.get("required", ()))  # checked already: present in var
        for key, sub in props.items():
            inner = pad
            if key not in required:
                out.append(f"{pad}if {key!r} in {var}:")
                inner = pad + "    "
            if _scalar(sub):
                local = f"_v{len(self.consts) + len(out)}"
                body: list[str] = []
                self.emit(sub, local, body, len(inner) // 4)
                if body:
                    out.append(f"{inner}{local} = {var}[{key!r}]")
                    out.extend(body)
                elif inner != pad:
                    out.append(f"{inner}pass")
            else:
                out.append(f"{inner}if not {self.function(sub)}({var}[{key!r}]): return False")

    def emit_all_of(self, branches: list[Any], var: str, out: list[str], depth: int,
                    known: bool = False) -> None:
        # ``allOf`` of ``if field == X then ...`` branches becomes one dispatch on the field.
        pad = "    " * depth
        dispatch: dict[str, dict[Any, str]] = {}
        for b in branches:
            cond = b.get("if", {}).get("properties", {})
            if len(b) == 2 and "then" in b and len(cond) == 1:
                (field, spec), = cond.items()
                if set(spec) == {"const"}:
                    dispatch.setdefault(field, {})[spec["const"]] = self.function(b["then"])
                    continue
            self.emit(b, var, out, depth)
        for field, table in dispatch.items():
            k = self.const(table)
            self.tables = getattr(self, "tables", [])
            self.tables.append(k)
            if known:
                out.append(f"{pad}f = {k}.get({var}.get({field!r}))")
                out.append(f"{pad}if f is not None and not f({var}): return False")
            else:
                out.append(f"{pad}if type({var}) is dict:")
                out.append(f"{pad}    f = {k}.get({var}.get({field!r}))")
                out.append(f"{pad}    if f is not None and not f({var}): return False")

    def build(self, s: Any) -> Check:
        entry = self.function(s, "_entry")
        return self.namespace()[entry]

    def namespace(self) -> dict[str, Any]:
        """Compile every function generated so far (one ``compile``: it is most of the
        cost); they are the values of their names in the namespace returned."""
        ns: dict[str, Any] = dict(self.consts)
        exec(compile("\n".join(self.lines), "<plan schema>", "exec"), ns)  # noqa: S102
        for t in getattr(self, "tables", []):  # function names -> functions
            ns[t] = {k: ns[v] for k, v in ns[t].items()}
            self.consts[t] = ns[t]
        return ns


#: the keywords of a schema that ``_CodeGen.emit`` writes as checks of the value alone
_SCALAR_KEYWORDS = frozenset({"type", "const", "enum", "pattern", "minLength", "minimum",
                              "maximum", "description"})


def _scalar(s: Any) -> bool:
    """A schema of a scalar whose checks can be written in place (no call, no nesting)."""
    return type(s) is dict and s.keys() <= _SCALAR_KEYWORDS and \
        s.get("type") not in ("object", "array")


def compile_schema(schema: dict[str, Any], pointer_to: str | None = None,
                   shallow: bool = False) -> Check:
    """A fast predicate equivalent to validating against ``schema`` (or one of its $defs).

    ``shallow`` leaves the items of the top-level ``nodes`` array to the caller.
    """
    if shallow:
        schema = _shallow(schema)
    gen = _CodeGen(schema)
    target: Any = schema
    if pointer_to:
        for part in pointer_to.lstrip("#/").split("/"):
            target = target[part]
    return gen.build(target)


def _shallow(schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "properties": {**schema["properties"],
                                     "nodes": {"type": "array", "minItems": 2}}}


#: the node schema that a plan's ``nodes`` hold
NODE = "#/$defs/node"


@cache
def _plan_checks(name: str) -> dict[tuple[str | None, bool], Check]:
    """The three checks a check of two plans uses (the whole plan, its top level alone,
    one node), generated together and compiled at once: compiling is most of the cost of
    a check, and the node's functions are the whole plan's."""
    schema = load_schema(name)
    if "nodes" not in schema.get("properties", {}) or \
            "node" not in schema.get("$defs", {}):
        return {}
    gen = _CodeGen(schema)
    names = {(None, False): gen.function(schema, "_entry"),
             (None, True): gen.function(_shallow(schema), "_shallow"),
             (NODE, False): gen.ref(NODE)}
    ns = gen.namespace()
    return {key: ns[fn] for key, fn in names.items()}


@cache
def compiled(name: str, pointer_to: str | None = None, shallow: bool = False) -> Check:
    together = _plan_checks(name).get((pointer_to, shallow))
    if together is not None:
        return together
    return compile_schema(load_schema(name), pointer_to, shallow)


def pointer(path: Any) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def validate(doc: Any, name: str, file: str) -> None:
    """Raise one PlanError naming the file, node and JSON pointer if ``doc`` is invalid."""
    if compiled(name)(doc):
        return
    raise explain(doc, name, file)


def explain(doc: Any, name: str, file: str) -> PlanError:
    errors, index = _errors(doc, name)
    if not errors:  # pragma: no cover - the compiled check and jsonschema disagree
        return PlanError("document rejected by the compiled schema check but accepted by "
                         "jsonschema; please report this", file=file, pointer="")
    err = _deepest(errors)
    path = list(err.absolute_path)
    if index is not None and path[:2] == ["nodes", 0]:
        path[1] = index
    node = node_id(doc, path)
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


@cache
def reference(name: str) -> Any:
    """The reference validator of a schema: Draft 2020-12 as the compiled check reads it,
    where an integer is an ``int`` in the document, never a float (JSON Schema would take
    ``1e308`` or ``3.0`` as integers, but they are floats to Python and to Spark, and
    ``1e308`` is no partition count)."""
    import jsonschema  # only on the error path: importing it costs more than a check

    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine("integer", lambda _checker, v: type(v) is int)
    return jsonschema.validators.extend(base, type_checker=checker)(load_schema(name))


def _errors(doc: Any, name: str) -> tuple[list[Any], int | None]:
    """The reference validator's errors, found without walking every node of a large plan
    (jsonschema lists every error of every node: minutes for 200,000 broken nodes).

    When the plan's top level is valid, the compiled check finds the first invalid node and
    only that node is explained, in a copy of the plan that holds it first (its index is
    returned, to put back into the path); otherwise the top level is explained with the
    first two nodes."""
    validator = reference(name)
    nodes = doc.get("nodes") if type(doc) is dict else None
    if name != "plan.v1.json" or type(nodes) is not list or len(nodes) <= 2:
        return list(validator.iter_errors(doc)), None
    if not compiled(name, None, True)(doc):
        return list(validator.iter_errors({**doc, "nodes": nodes[:2]})), None
    node_ok = compiled(name, "#/$defs/node")
    index = next((i for i, n in enumerate(nodes) if not node_ok(n)), None)
    if index is None:  # pragma: no cover - the shallow and node checks make the whole
        return list(validator.iter_errors(doc)), None
    errors = [e for e in validator.iter_errors({**doc, "nodes": [nodes[index]] * 2})
              if list(e.absolute_path)[:1] != ["nodes"] or len(e.absolute_path) > 1]
    return errors, index


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


_TYPE_NAMES = {"integer": "an integer", "string": "a string", "object": "an object",
               "array": "an array", "boolean": "a boolean (true or false)",
               "number": "a number"}


def _expected(err: Any) -> str:
    v, val = err.validator, err.validator_value
    if v == "type":
        return _TYPE_NAMES.get(val, f"a value of type {val}") if isinstance(val, str) \
            else f"a value of type {val}"
    if v == "enum":
        return "one of " + ", ".join(map(str, val))
    if v == "const":
        return json.dumps(val)
    if v == "pattern":
        return f"a string matching {val}"
    if v == "minimum":
        return f"a number >= {val}"
    if v == "maximum":
        return f"a number <= {val}"
    if v == "minItems":
        return f"at least {val} item(s)"
    if v == "minLength":
        return "a non-empty string"
    return f"{v} {json.dumps(val)[:60]}"


def node_id(doc: Any, path: list[Any]) -> str | None:
    """The id of the innermost node (plan node or recursive body node) on ``path``."""
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
