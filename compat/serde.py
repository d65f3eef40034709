"""Plans to and from JSON documents: the only module that knows the JSON layout.

``load`` reads a file, validates it against ``compat/schemas/plan.v1.json`` and builds the model;
``from_doc`` builds the model from an already schema-valid document; ``to_doc`` writes it
back.  One generic reader and writer serve every step: they walk the dataclass fields of the
step's class (``compat.model.prop`` declares each field's JSON key and default), so a new
step type needs nothing here.  Every fixture is round-tripped in a test.
"""

from __future__ import annotations

import dataclasses
import json
import marshal
import re
import sys
import types
import typing
from functools import cache
from typing import Any

import compat.steps  # noqa: F401  (registers every step type)
from compat import schema_check
from compat.errors import PlanError
from compat.model import (
    STEPS,
    Node,
    Plan,
    build_graph,
    check_arity,
    json_key,
    required,
    step_fields,
)

FORMAT = "theseus.plan/1"


def read_json(path: str, raw: bytes | None = None) -> Any:
    """Read a JSON file; unreadable files and malformed JSON become one PlanError.

    ``raw`` gives the file's bytes when they do not come from disk (a file at a git ref).
    Stricter than ``json.loads``: a key twice in one object, ``NaN``/``Infinity`` (not
    JSON) and integers beyond Python's digit limit are refused with their JSON pointer.
    """
    try:
        if raw is None:
            with open(path, "rb") as f:
                raw = f.read()
    except FileNotFoundError:
        raise PlanError("file not found", file=path, expected="a readable plan file",
                        found="no such file") from None
    except IsADirectoryError:
        raise PlanError("is a directory", file=path, expected="a plan file",
                        found="a directory") from None
    except OSError as e:
        raise PlanError(f"cannot read file: {e.strerror}", file=path) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PlanError(f"not UTF-8 text (byte {e.start})", file=path,
                        expected="a UTF-8 JSON document", found="binary data") from None
    try:
        doc = _STRICT.decode(text)
    except json.JSONDecodeError as e:
        lines = text.splitlines()
        line = lines[e.lineno - 1] if 0 < e.lineno <= len(lines) else ""
        raise PlanError(f"malformed JSON at line {e.lineno}, column {e.colno}: {e.msg}",
                        file=path, pointer=None, expected="a JSON document",
                        found=repr(line.strip()[:60]) if line.strip() else "empty file"
                        ) from None
    except RecursionError:
        raise PlanError("JSON nested too deeply", file=path, expected="a plan document",
                        found="arrays or objects nested beyond Python's recursion limit"
                        ) from None
    except (_Refused, ValueError):
        # Only on this path: parse again, marking what was refused, to say where it is.
        raise _explain_refused(text, path) from None
    if _SURROGATE_ESCAPE.search(text):  # UTF-8 text has no surrogates: only an escape can
        _refuse_surrogates(doc, path)
    return doc


def _escaped(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _refuse_surrogates(doc: Any, path: str) -> None:
    """A string holding half of a UTF-16 pair (``"\\ud800"``) is no Unicode text: it could
    not be printed, written as UTF-8 or sent to Kafka."""
    stack: list[tuple[Any, list[Any]]] = [(doc, [])]
    while stack:
        value, at = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                bad = value[e.start]
                node = schema_check.node_id(doc, at)
                raise PlanError("a string holds a lone surrogate, which is not Unicode text",
                                file=path, node=node and _escaped(node),
                                pointer=_escaped(schema_check.pointer(at)),
                                expected="text that UTF-8 can encode",
                                found=f"\\u{ord(bad):04x}") from None
        elif isinstance(value, dict):
            stack.extend((k, [*at, k]) for k in value)
            stack.extend((v, [*at, k]) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, [*at, i]) for i, v in enumerate(value))


class _Refused(Exception):
    """A key twice in one object, or NaN/Infinity: found again by ``_explain_refused``."""


def _unique_pairs(pairs: list[tuple[str, Any]], dict: type = dict, len: Any = len) -> Any:
    # Called for every object of every plan: as little work as a plain dict (measured on
    # bench/check_speed.py's 20,000-node plans: about 10% over json.loads).
    d = dict(pairs)
    if len(d) != len(pairs):
        raise _Refused
    return d


def _no_constant(name: str) -> Any:
    raise _Refused


_STRICT = json.JSONDecoder(object_pairs_hook=_unique_pairs, parse_constant=_no_constant)


class _Mark:
    """What the explaining parse puts where the strict one refused a value."""

    def __init__(self, message: str, expected: str, found: str, key: str | None = None):
        self.message, self.expected, self.found, self.key = message, expected, found, key


class _MarkedDict(dict):  # type: ignore[type-arg]
    mark: _Mark


def _explain_refused(text: str, path: str) -> PlanError:
    def pairs(items: list[tuple[str, Any]]) -> Any:
        d = _MarkedDict(items)
        if len(d) != len(items):
            seen: set[str] = set()
            for key, _ in items:
                if key in seen:
                    break
                seen.add(key)
            d.mark = _Mark(f"duplicate key '{key}' in one object", "each key once "
                           "(JSON readers disagree on which value wins)",
                           f"'{key}' {sum(1 for k, _ in items if k == key)} times", key)
        return d

    def big_int(s: str) -> Any:
        try:
            return int(s)
        except ValueError:  # beyond Python's limit on digits (4300)
            digits = len(s.lstrip("-"))
            return _Mark("number too large", "an integer of at most "
                         f"{sys.get_int_max_str_digits()} digits",
                         f"{s[:12]}... ({digits} digits)")

    def constant(name: str) -> Any:
        return _Mark(f"'{name}' is not JSON", "a JSON number", name)

    try:
        doc = json.loads(text, object_pairs_hook=pairs, parse_int=big_int,
                         parse_constant=constant)
    except (ValueError, RecursionError) as e:  # pragma: no cover - refused above already
        return PlanError(f"malformed JSON: {e}", file=path)
    stack: list[tuple[Any, list[Any]]] = [(doc, [])]
    while stack:  # document order: the first refused value is the one reported
        value, at = stack.pop()
        if isinstance(value, _MarkedDict) and hasattr(value, "mark"):
            value, at = value.mark, [*at, value.mark.key]
        if isinstance(value, _Mark):
            return PlanError(value.message, file=path, node=schema_check.node_id(doc, at),
                             pointer=schema_check.pointer(at), expected=value.expected,
                             found=value.found)
        if isinstance(value, dict):
            stack.extend((v, [*at, k]) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((v, [*at, i]) for i, v in reversed(list(enumerate(value))))
    return PlanError("malformed JSON", file=path)  # pragma: no cover


def load(path: str, reuse: Plan | None = None, raw: bytes | None = None) -> Plan:
    """Read, schema-validate and build a plan (semantic checks live in ``compat.infer``)."""
    doc = read_json(path, raw)
    return from_doc(doc, path, reuse)


def from_doc(doc: Any, file: str = "<plan>", reuse: Plan | None = None) -> Plan:
    """Build a plan from a document.

    With ``reuse`` (a plan loaded before, typically the old side of a check), a node whose
    document equals the old one's, key for key, was already validated and is shared as the
    same object instead of being validated and built again.
    """
    try:
        return _from_doc(doc, file, reuse)
    except RecursionError:
        # Only recursive steps nest nodes, and a recursive body holds no recursive step:
        # the validation recursing through hundreds of them says so too late.
        raise _too_deep(doc, file) from None


def _too_deep(doc: Any, file: str) -> PlanError:
    stack: list[tuple[Any, list[Any], bool]] = [(doc, [], False)]
    while stack:
        value, at, in_body = stack.pop()
        if isinstance(value, dict):
            if in_body and value.get("step") == "recursive":
                return PlanError("a recursive step cannot be inside a recursive body",
                                 file=file, node=schema_check.node_id(doc, at),
                                 pointer=schema_check.pointer([*at, "step"]),
                                 expected="passive or stateful steps", found="'recursive'")
            stack.extend((v, [*at, k], in_body or k == "body") for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, [*at, i], in_body) for i, v in enumerate(value))
    return PlanError("the plan is nested too deeply", file=file,
                     expected="nodes nested a few levels deep", found="hundreds of levels")


def _from_doc(doc: Any, file: str, reuse: Plan | None) -> Plan:
    if isinstance(doc, dict) and doc.get("format") not in (FORMAT, None) and \
            isinstance(doc.get("format"), str):
        raise PlanError("unsupported plan format", file=file, pointer="/format",
                        expected=f"'{FORMAT}'", found=repr(doc["format"]))
    old_docs = reuse.documents if reuse is not None else {}
    #: per node, whether its document equals the old plan's node of its id
    same: list[bool] = []
    if not old_docs:
        schema_check.validate(doc, "plan.v1.json", file)
    else:
        shallow = schema_check.compiled("plan.v1.json", None, True)
        node_ok = schema_check.compiled("plan.v1.json", schema_check.NODE)
        ok = shallow(doc)
        if ok:
            for d in doc["nodes"]:
                # an id of the wrong type (a list) is no key: the schema check reports it
                nid = d.get("id") if type(d) is dict else None
                prev = old_docs.get(nid) if type(nid) is str else None
                equal = prev is not None and _same_doc(prev, d)
                same.append(equal)
                if not equal and not node_ok(d):
                    ok = False
                    break
        if not ok:
            raise schema_check.explain(doc, "plan.v1.json", file)
    pointers: dict[str, str] = {}
    documents: dict[str, Any] = {}
    old_nodes = reuse.nodes if reuse is not None else {}
    try:
        nodes = []
        for i, d in enumerate(doc["nodes"]):
            nid = d["id"]
            if same and same[i] and nid in old_nodes and nid not in pointers:
                node = old_nodes[nid]
                ptr = pointers[nid] = f"/nodes/{i}"
                if _reader(node.__class__).nested:
                    _nested_pointers(node, d, ptr, pointers)
            else:
                node = _node(d, f"/nodes/{i}", pointers)
            nodes.append(node)
            documents[nid] = d
    except PlanError as e:
        raise e.with_location(file=file) from None
    if old_docs and _same_graph(doc["nodes"], old_docs):
        # Same ids with the same inputs in the same order: the same graph, the same order.
        assert reuse is not None
        new_by_id = {n.id: n for n in nodes}
        for n in nodes:
            if n is not old_nodes.get(n.id):
                check_arity(n, file, pointers)
        by_id = {nid: new_by_id[nid] for nid in reuse.nodes}
        dependents = reuse.dependents
    else:
        by_id, dependents = build_graph(nodes, file, pointers)
    sinks = [n.id for n in nodes if n.step == "sink"]
    if len(sinks) != 1:
        found = ", ".join(f"'{s}' at {pointers[s]}" for s in sinks) or "none"
        raise PlanError("a plan has exactly one sink", file=file,
                        node=sinks[1] if len(sinks) > 1 else None,
                        pointer=pointers[sinks[1]] if len(sinks) > 1 else "/nodes",
                        expected="exactly one sink step", found=found)
    plan = Plan(query=doc["query"], nodes=by_id, config=dict(doc.get("config", {})),
                metadata=dict(doc.get("metadata", {})),
                extras={k: v for k, v in doc.items() if k.startswith("x-")},
                file=file, pointers=pointers, dependents=dependents, sink_id=sinks[0],
                documents=documents)
    return plan


def _same_doc(prev: dict[str, Any], d: dict[str, Any]) -> bool:
    """The node documents are equal, value types included.

    Python's ``==`` says ``1 == 1.0 == True``: a new document with ``"version": true`` or
    ``"partitions": 3.0`` would pass for the valid old one and skip validation.  ``version``
    is in every node and is checked on its own; only steps holding other numbers or
    booleans (sources, top-N...) are compared byte for byte by ``marshal``, which writes
    each value's type (a node with its keys reordered is then validated again: slower,
    never wrong).  Format 0: later formats write back-references that depend on reference
    counts, so two equal documents could differ."""
    return prev == d and type(d["version"]) is int and (
        d["step"] not in _TYPED_STEPS or marshal.dumps(prev, 0) == marshal.dumps(d, 0))


def _scalar_types(t: Any, seen: frozenset[type] = frozenset()) -> set[Any]:
    """The scalar types a field's value can hold, through tuples, optionals and values."""
    origin = typing.get_origin(t)
    if origin is tuple or origin in (typing.Union, types.UnionType):
        return {s for a in typing.get_args(t) if a is not Ellipsis
                for s in _scalar_types(a, seen)}
    if isinstance(t, type) and issubclass(t, Node):
        return {int, bool}  # a recursive step's body: any step
    if dataclasses.is_dataclass(t) and t not in seen:
        hints = typing.get_type_hints(t)
        return {s for f in dataclasses.fields(t) for s in _scalar_types(hints[f.name],
                                                                       seen | {t})}
    return {t}


#: steps whose documents hold numbers or booleans besides ``version``
_TYPED_STEPS = frozenset(
    name for name, cls in STEPS.items()
    if {int, bool} & {s for f in step_fields(cls)
                      for s in _scalar_types(typing.get_type_hints(cls)[f.name])})


def _same_graph(docs: list[dict[str, Any]], old_docs: dict[str, Any]) -> bool:
    """The nodes have the ids and inputs of the old plan's, in the same order."""
    return len(docs) == len(old_docs) and all(
        d["id"] == oid and d.get("inputs") == od.get("inputs")
        for d, (oid, od) in zip(docs, old_docs.items()))


# -- reading nodes ---------------------------------------------------------------------------
#
# Each class gets its reader once: its fields' defaults, and per field present in JSON the
# JSON key and a converter from the JSON value (None: taken as it is; _NODES: a recursive
# step's body).  Objects are made as pickle makes them, without calling ``__init__``: the
# document was validated against the schema the same classes generate, and a check builds
# tens of thousands of them.

_NODES = "nodes"
_NO_EXTRAS: dict[str, Any] = {}  # shared by nodes without x-* keys; never mutated


@dataclasses.dataclass(frozen=True)
class _Reader:
    cls: type
    defaults: dict[str, Any]
    fields: tuple[tuple[str, str, Any], ...]
    #: every field a scalar under its own name: the document's dict is the object's
    plain: bool
    #: some field holds nodes (a recursive step's body)
    nested: bool


@cache
def _reader(cls: type) -> _Reader:
    hints = typing.get_type_hints(cls)
    own = _own_fields(cls)
    defaults = {f.name: f.default for f in own if not required(f)}
    if issubclass(cls, Node):
        defaults.update(description=None, extras=_NO_EXTRAS)
    fields = tuple((f.name, json_key(f), _converter(hints[f.name])) for f in own)
    plain = all(conv is None and name == key for name, key, conv in fields)
    return _Reader(cls, defaults, fields, plain, any(conv is _NODES for _, _, conv in fields))


def _make(cls: type, values: dict[str, Any]) -> Any:
    obj = object.__new__(cls)
    obj.__dict__.update(values)
    return obj


def _plain_items(cls: type, defaults: dict[str, Any]) -> Any:
    """The converter of a list of plain dataclass values (columns, named expressions):
    ``tuple([_make(cls, {**defaults, **x}) for x in v])`` in one call per list."""
    new = object.__new__

    def items(v: list[dict[str, Any]]) -> tuple[Any, ...]:
        out = []
        for x in v:
            obj = new(cls)
            obj.__dict__.update({**defaults, **x} if defaults else x)
            out.append(obj)
        return tuple(out)

    return items


def _own_fields(cls: type) -> tuple[dataclasses.Field, ...]:
    if issubclass(cls, Node):
        return step_fields(cls)
    return dataclasses.fields(cls)


def _converter(t: Any) -> Any:
    origin = typing.get_origin(t)
    if origin is tuple:
        (item, _dots) = typing.get_args(t)
        if item is Node:
            return _NODES
        conv = _converter(item)
        if conv is None:
            return tuple
        if dataclasses.is_dataclass(item) and _reader(item).plain:
            return _plain_items(item, _reader(item).defaults)
        return lambda v: tuple([conv(x) for x in v])
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in typing.get_args(t) if a is not type(None)]
        conv = _converter(inner)
        if conv is None:
            return None
        return lambda v: None if v is None else conv(v)
    if dataclasses.is_dataclass(t):
        r = _reader(t)
        if r.plain:
            return lambda v: _make(t, {**r.defaults, **v})
        return lambda v: _make(t, {**r.defaults, **{
            name: (v[key] if conv is None else conv(v[key]))
            for name, key, conv in r.fields if key in v}})
    return None  # str, int, bool: as in the document


def node_from_doc(d: dict[str, Any], pointer: str = "") -> Node:
    """One node from its (schema-valid) document."""
    return _node(d, pointer, {})


def _node(d: dict[str, Any], ptr: str, pointers: dict[str, str], prefix: str = "") -> Node:
    nid = d["id"]
    key = prefix + nid
    if key in pointers:
        raise PlanError(f"duplicate node id '{nid}'", node=nid, pointer=ptr + "/id",
                        expected="ids unique within the plan",
                        found=f"'{nid}' already used at {pointers[key]}")
    pointers[key] = ptr
    cls = STEPS[d["step"]]
    r = _reader(cls)
    if d["version"] > cls.max_version:
        # Old versions stay buildable for ever; a newer one means what a newer Theseus
        # says, which this one would build as something else.
        known = "version 1" if cls.max_version == 1 else f"versions 1 to {cls.max_version}"
        raise PlanError(f"step '{cls.step}' has no version {d['version']} in this Theseus",
                        node=nid, pointer=ptr + "/version",
                        expected=f"{known} of step '{cls.step}'",
                        found=f"version {d['version']}",
                        hint="A newer Theseus wrote this plan: check and run it with that "
                             "version, or write a version this one knows.")
    vals = dict(r.defaults)
    vals["id"] = nid
    vals["version"] = d["version"]
    vals["inputs"] = tuple(d["inputs"]) if "inputs" in d else ()
    read = 4 if "inputs" in d else 3  # id, step, version, inputs
    for name, k, conv in r.fields:
        if k in d:
            read += 1
            v = d[k]
            if conv is None:
                vals[name] = v
            elif conv is _NODES:
                vals[name] = tuple(_node(b, f"{ptr}/{k}/{j}", pointers, prefix=f"{key}/")
                                   for j, b in enumerate(v))
            else:
                vals[name] = conv(v)
    if len(d) > read:  # a description or x-* keys
        if "description" in d:
            vals["description"] = d["description"]
        extras = {k: v for k, v in d.items() if k[:2] == "x-"}
        if extras:
            vals["extras"] = extras
    return _make(r.cls, vals)


def _nested_pointers(node: Node, d: dict[str, Any], ptr: str,
                     pointers: dict[str, str]) -> None:
    """Pointers of the nodes inside a reused node (a recursive step's body)."""
    for name, k, conv in _reader(type(node)).fields:
        if conv is _NODES:
            for j, (b, bd) in enumerate(zip(getattr(node, name), d[k])):
                pointers.setdefault(f"{node.id}/{b.id}", f"{ptr}/{k}/{j}")
                _nested_pointers(b, bd, f"{ptr}/{k}/{j}", pointers)


# -- writing ------------------------------------------------------------------------------------


def to_doc(plan: Plan) -> dict[str, Any]:
    return plan_doc(plan, [node_doc(n) for n in plan.nodes.values()])


def plan_doc(plan: Plan, nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """The document of ``plan`` (its query, config, metadata and x- keys) over ``nodes``."""
    doc: dict[str, Any] = {"format": FORMAT, "query": plan.query}
    if plan.config:
        doc["config"] = dict(plan.config)
    if plan.metadata:
        doc["metadata"] = dict(plan.metadata)
    doc.update(plan.extras)
    doc["nodes"] = nodes
    return doc


def node_doc(n: Node) -> dict[str, Any]:
    """A node's document: common keys first, then the step's fields in declaration order
    (a field at its default left out unless it is required), then its ``x-*`` keys."""
    d: dict[str, Any] = {"id": n.id, "step": n.step, "version": n.version}
    if n.inputs:
        d["inputs"] = list(n.inputs)
    if n.description is not None:
        d["description"] = n.description
    _write_fields(n, d)
    d.update(n.extras)
    return d


@cache
def _writer(cls: type) -> tuple[tuple[str, str, bool, Any], ...]:
    return tuple((f.name, json_key(f), required(f), f.default) for f in _own_fields(cls))


def _write_fields(obj: Any, d: dict[str, Any]) -> None:
    for name, key, req, default in _writer(type(obj)):
        v = getattr(obj, name)
        if req or v != default:
            d[key] = _value_doc(v)


def _value_doc(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_value_doc(x) for x in v]
    if isinstance(v, Node):
        return node_doc(v)
    if dataclasses.is_dataclass(v):
        d: dict[str, Any] = {}
        _write_fields(v, d)
        return d
    return v


def dumps(plan: Plan) -> str:
    return json.dumps(to_doc(plan), indent=2) + "\n"


__all__ = ["FORMAT", "dumps", "from_doc", "load", "node_doc", "node_from_doc", "read_json",
           "to_doc"]
