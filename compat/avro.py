"""Avro schemas for ``format: avro`` topics, without any Avro library.

The gate must judge Avro schemas where only the plain package is installed, so this module
parses them (:func:`parse`), converts between Spark types and Avro (:func:`from_columns`,
:func:`spark_type`) and decides whether a reader schema can read what a writer schema wrote
by Avro's own schema resolution rules (:func:`incompatibilities`, after the specification's
"Schema Resolution" and the Java library's ``SchemaCompatibility``):

* a record is read field by field, matched by name (or by the reader field's aliases); a
  writer field the reader lacks is skipped; a reader field the writer lacks takes the
  reader's default, and without one the schemas are incompatible
  (``READER_FIELD_MISSING_DEFAULT_VALUE``);
* primitives must be equal, or promoted: int to long, float or double; long to float or
  double; float to double; string and bytes both ways (``TYPE_MISMATCH``);
* named types (record, enum, fixed) must have the same unqualified name, or the reader an
  alias of it (``NAME_MISMATCH``); fixed the same size (``FIXED_SIZE_MISMATCH``); every
  writer symbol of an enum must be a reader symbol unless the reader has a default
  (``MISSING_ENUM_SYMBOLS``);
* a writer union is readable when every branch is (a record with a branch the reader cannot
  read fails only when that branch is written, but a registry refuses it all the same); a
  reader union reads a writer that one of its branches reads (``MISSING_UNION_BRANCH``).

Logical types do not take part in resolution (the specification resolves the underlying
types), except that Spark's reading of them decides the column type.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from compat import types as T
from compat.errors import PlanError

PRIMITIVES = ("null", "boolean", "int", "long", "float", "double", "bytes", "string")
NAMED = ("record", "enum", "fixed")
#: writer type -> reader types that read it (besides itself)
PROMOTIONS = {"int": ("long", "float", "double"), "long": ("float", "double"),
              "float": ("double",), "string": ("bytes",), "bytes": ("string",)}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: subject name strategies (Confluent's serializers' ``subject.name.strategy``)
SUBJECT_STRATEGIES = ("topic_name", "record_name", "topic_record_name")

Schema = Any  # a parsed schema: a primitive name, or a dict (record, enum, ...), or a list


class AvroSchemaError(PlanError):
    """An Avro schema that is not JSON or not a valid schema; ``where`` is a JSON pointer
    inside the schema (the plan's own location is added by the step that holds it)."""

    def __init__(self, message: str, where: str = "", **kw: object) -> None:
        self.schema_pointer = where
        super().__init__(message + (f" (at {where} in the Avro schema)" if where else ""),
                         **kw)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- parsing

def parse(text: str | Mapping[str, Any]) -> Schema:
    """A schema from its JSON text (or document), names resolved: a reference to a named
    type is the named type's own dict (so a recursive record is a cyclic structure)."""
    if isinstance(text, str):
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise AvroSchemaError(f"the Avro schema is not JSON: {e}", expected="JSON text",
                                  found=repr(text[:60])) from None
    else:
        doc = text
    return _Parser().schema(doc, "", None)


class _Parser:
    def __init__(self) -> None:
        self.names: dict[str, dict[str, Any]] = {}

    def schema(self, doc: Any, where: str, ns: str | None) -> Schema:
        if isinstance(doc, str):
            if doc in PRIMITIVES:
                return doc
            full = doc if "." in doc or not ns else f"{ns}.{doc}"
            for name in (full, doc):
                if name in self.names:
                    return self.names[name]
            raise AvroSchemaError(f"unknown Avro type '{doc}'", where,
                                  expected="a primitive or a named type defined before",
                                  found=repr(doc))
        if isinstance(doc, list):
            return self.union(doc, where, ns)
        if not isinstance(doc, dict):
            raise AvroSchemaError("an Avro schema is a type name, an object or a union",
                                  where, expected="string, object or array",
                                  found=type(doc).__name__)
        kind = doc.get("type")
        if kind in PRIMITIVES:
            logical = doc.get("logicalType")
            if logical is None:
                return kind
            out = {"type": kind, "logicalType": logical}
            for k in ("precision", "scale"):
                if k in doc:
                    out[k] = doc[k]
            if logical == "decimal":
                _decimal_args(out, where)
            return out
        if kind == "record" or kind == "error":
            return self.record(doc, where, ns)
        if kind == "enum":
            return self.enum(doc, where, ns)
        if kind == "fixed":
            size = doc.get("size")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise AvroSchemaError("a fixed type needs a size", f"{where}/size",
                                      expected="a non-negative integer", found=repr(size))
            out = self.named(doc, where, ns, "fixed")
            out["size"] = size
            return out
        if kind == "array":
            if "items" not in doc:
                raise AvroSchemaError("an array needs 'items'", where,
                                      expected="items", found="none")
            return {"type": "array", "items": self.schema(doc["items"], f"{where}/items", ns)}
        if kind == "map":
            if "values" not in doc:
                raise AvroSchemaError("a map needs 'values'", where,
                                      expected="values", found="none")
            return {"type": "map", "values": self.schema(doc["values"], f"{where}/values", ns)}
        if isinstance(kind, (dict, list)) or (isinstance(kind, str) and kind not in NAMED):
            # {"type": "com.acme.Name"} or {"type": {...}}: the schema is the nested one
            return self.schema(kind, f"{where}/type", ns)
        raise AvroSchemaError("unknown Avro type", f"{where}/type",
                              expected="a primitive, record, enum, fixed, array or map",
                              found=repr(kind))

    def named(self, doc: dict[str, Any], where: str, ns: str | None,
              kind: str) -> dict[str, Any]:
        name = doc.get("name")
        if not isinstance(name, str) or not all(_NAME.fullmatch(p) for p in name.split(".")):
            raise AvroSchemaError(f"a {kind} needs a name", f"{where}/name",
                                  expected="a name such as 'Order' or 'com.acme.Order'",
                                  found=repr(name))
        space = doc.get("namespace", ns) if "." not in name else name.rsplit(".", 1)[0]
        full = name if "." in name or not space else f"{space}.{name}"
        if full in self.names or full in PRIMITIVES:
            raise AvroSchemaError(f"the name '{full}' is defined twice", f"{where}/name",
                                  expected="unique names", found=repr(full))
        aliases = doc.get("aliases", [])
        if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
            raise AvroSchemaError("aliases are a list of names", f"{where}/aliases",
                                  expected="a list of strings", found=repr(aliases))
        out: dict[str, Any] = {"type": kind, "name": full, "aliases": tuple(aliases)}
        self.names[full] = out
        return out

    def record(self, doc: dict[str, Any], where: str, ns: str | None) -> dict[str, Any]:
        out = self.named(doc, where, ns, "record")
        space = out["name"].rsplit(".", 1)[0] if "." in out["name"] else None
        fields = doc.get("fields")
        if not isinstance(fields, list):
            raise AvroSchemaError("a record needs a list of fields", f"{where}/fields",
                                  expected="a list", found=repr(fields))
        seen: set[str] = set()
        parsed = []
        for i, fd in enumerate(fields):
            at = f"{where}/fields/{i}"
            if not isinstance(fd, dict):
                raise AvroSchemaError("a field is an object", at, expected="an object",
                                      found=type(fd).__name__)
            name = fd.get("name")
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                raise AvroSchemaError("a field needs a name", f"{at}/name",
                                      expected="a name of letters, digits and _",
                                      found=repr(name))
            if name in seen:
                raise AvroSchemaError(f"field '{name}' is declared twice", f"{at}/name",
                                      expected="unique field names", found=repr(name))
            seen.add(name)
            if "type" not in fd:
                raise AvroSchemaError(f"field '{name}' has no type", at, expected="type",
                                      found="none")
            ftype = self.schema(fd["type"], f"{at}/type", space)
            f: dict[str, Any] = {"name": name, "type": ftype,
                                 "aliases": tuple(fd.get("aliases", ()))}
            if "default" in fd:
                problem = default_problem(ftype, fd["default"])
                if problem:
                    raise AvroSchemaError(f"the default of field '{name}' does not fit its "
                                          f"type: {problem}", f"{at}/default",
                                          expected=f"a value of {describe(ftype)}",
                                          found=json.dumps(fd["default"]))
                f["default"] = fd["default"]
            parsed.append(f)
        out["fields"] = tuple(parsed)
        return out

    def enum(self, doc: dict[str, Any], where: str, ns: str | None) -> dict[str, Any]:
        out = self.named(doc, where, ns, "enum")
        symbols = doc.get("symbols")
        if not isinstance(symbols, list) or not all(
                isinstance(s, str) and _NAME.fullmatch(s) for s in symbols) \
                or len(set(symbols)) != len(symbols):
            raise AvroSchemaError("an enum needs a list of distinct symbols",
                                  f"{where}/symbols", expected="distinct names",
                                  found=repr(symbols))
        out["symbols"] = tuple(symbols)
        if "default" in doc:
            if doc["default"] not in symbols:
                raise AvroSchemaError("an enum's default is one of its symbols",
                                      f"{where}/default", expected="one of " +
                                      ", ".join(symbols), found=repr(doc["default"]))
            out["default"] = doc["default"]
        return out

    def union(self, doc: list[Any], where: str, ns: str | None) -> list[Schema]:
        out = []
        seen = set()
        for i, b in enumerate(doc):
            if isinstance(b, list):
                raise AvroSchemaError("a union cannot hold a union", f"{where}/{i}",
                                      expected="a type", found="a union")
            s = self.schema(b, f"{where}/{i}", ns)
            key = branch_key(s)
            if key in seen:
                raise AvroSchemaError(f"the union holds {key} twice", f"{where}/{i}",
                                      expected="distinct branches", found=key)
            seen.add(key)
            out.append(s)
        return out


def _decimal_args(d: dict[str, Any], where: str) -> None:
    p, s = d.get("precision"), d.get("scale", 0)
    if not isinstance(p, int) or p < 1 or not isinstance(s, int) or not 0 <= s <= p:
        raise AvroSchemaError("a decimal needs a precision of at least 1 and a scale from 0 "
                              "to the precision", where, expected="precision >= 1, "
                              "0 <= scale <= precision", found=f"precision {p}, scale {s}")


def kind(s: Schema) -> str:
    """The underlying type of a schema: a primitive name, a complex kind, or 'union'."""
    if isinstance(s, list):
        return "union"
    if isinstance(s, str):
        return s
    return s["type"]


def branch_key(s: Schema) -> str:
    """What a union tells its branches apart by: the full name of a named type, the type
    otherwise."""
    k = kind(s)
    return s["name"] if k in NAMED else k


def describe(s: Schema) -> str:
    k = kind(s)
    if k == "union":
        return "[" + ", ".join(describe(b) for b in s) + "]"
    if k in NAMED:
        return f"{k} {s['name']}"
    if k == "array":
        return f"array of {describe(s['items'])}"
    if k == "map":
        return f"map of {describe(s['values'])}"
    if isinstance(s, dict) and s.get("logicalType"):
        return f"{k} ({s['logicalType']})"
    return k


def default_problem(s: Schema, v: Any) -> str | None:
    """Why ``v`` is not a valid default of ``s`` (JSON encoding of the specification), or
    None.  A union's default is a value of its first branch."""
    k = kind(s)
    if k == "union":
        if not s:
            return "an empty union has no value"
        p = default_problem(s[0], v)
        return f"a union's default is a value of its first branch: {p}" if p else None
    ok: bool
    if k == "null":
        ok = v is None
    elif k == "boolean":
        ok = isinstance(v, bool)
    elif k in ("int", "long"):
        ok = isinstance(v, int) and not isinstance(v, bool)
    elif k in ("float", "double"):
        ok = isinstance(v, (int, float)) and not isinstance(v, bool)
    elif k in ("bytes", "string", "fixed"):
        ok = isinstance(v, str)
    elif k == "enum":
        ok = v in s["symbols"]
    elif k == "array":
        if not isinstance(v, list):
            return "not a list"
        return next((p for p in (default_problem(s["items"], x) for x in v) if p), None)
    elif k == "map":
        if not isinstance(v, dict):
            return "not an object"
        return next((p for p in (default_problem(s["values"], x) for x in v.values()) if p),
                    None)
    elif k == "record":
        if not isinstance(v, dict):
            return "not an object"
        for f in s["fields"]:
            if f["name"] in v:
                p = default_problem(f["type"], v[f["name"]])
            elif "default" in f:
                continue
            else:
                p = f"no value for field '{f['name']}'"
            if p:
                return p
        return None
    else:
        return None
    if ok:
        return None
    return f"{describe(s)} cannot hold {json.dumps(v)}"


# --------------------------------------------------------------------------- Spark types

_TO_AVRO = {"boolean": "boolean", "tinyint": "int", "smallint": "int", "int": "int",
            "bigint": "long", "float": "float", "double": "double", "string": "string",
            "binary": "bytes",
            "date": {"type": "int", "logicalType": "date"},
            "timestamp": {"type": "long", "logicalType": "timestamp-micros"},
            "timestamp_ntz": {"type": "long", "logicalType": "local-timestamp-micros"}}


class UnsupportedType(ValueError):
    """A Spark type with no Avro counterpart (or an Avro type with no Spark one)."""


def avro_type(spark: str, name: str, nullable: bool = True) -> Any:
    """The Avro schema document of a Spark type (``name`` names nested records); a nullable
    one is the union of null and it, with default null."""
    t = T.parse_type(spark)
    inner = _avro_of(t, name)
    return ["null", inner] if nullable else inner


def _avro_of(t: str, name: str) -> Any:
    if t in _TO_AVRO:
        v = _TO_AVRO[t]
        return dict(v) if isinstance(v, dict) else v
    ps = T.decimal_ps(t)
    if ps is not None:
        return {"type": "bytes", "logicalType": "decimal", "precision": ps[0], "scale": ps[1]}
    if t.startswith("array<"):
        return {"type": "array", "items": ["null", _avro_of(T.array_element(t), name)]}
    if t.startswith("map<"):
        k, v = T.map_kv(t)
        if k != "string":
            raise UnsupportedType(f"Avro maps have string keys, not {k}")
        return {"type": "map", "values": ["null", _avro_of(v, name)]}
    if t.startswith("struct<"):
        return record_doc(name, [(n, ft, True) for n, ft in T.struct_fields(t)])
    raise UnsupportedType(f"Spark type {t} has no Avro counterpart")


def record_doc(full_name: str, columns: Sequence[tuple[str, str, bool]]) -> dict[str, Any]:
    """The Avro record document of columns ``(name, spark type, nullable)``: a nullable
    column is ``["null", T]`` with default null, so that a column added or dropped later
    keeps the schemas compatible both ways."""
    space, _, short = full_name.rpartition(".")
    fields = []
    for n, t, nullable in columns:
        f: dict[str, Any] = {"name": n, "type": avro_type(t, f"{full_name}_{n}", nullable)}
        if nullable:
            f["default"] = None
        fields.append(f)
    doc: dict[str, Any] = {"type": "record", "name": short, "fields": fields}
    if space:
        doc["namespace"] = space
    return doc


def record_name(topic: str) -> str:
    """The record name derived from a topic: an Avro name (letters, digits, _)."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", topic)
    return name if re.match(r"[A-Za-z_]", name) else f"_{name}"


def spark_type(s: Schema) -> tuple[str, bool]:
    """The Spark type a schema reads as (Spark's ``from_avro``) and whether it is nullable:
    ``["null", T]`` is T nullable; other unions have no column type."""
    k = kind(s)
    if k == "union":
        rest = [b for b in s if kind(b) != "null"]
        if len(rest) == 1:
            return spark_type(rest[0])[0], True
        raise UnsupportedType(f"the union {describe(s)} is not one type or null")
    if isinstance(s, dict) and s.get("logicalType"):
        lt = s["logicalType"]
        if lt == "decimal" and k in ("bytes", "fixed"):
            return f"decimal({s['precision']},{s.get('scale', 0)})", False
        if lt == "date" and k == "int":
            return "date", False
        if lt in ("timestamp-millis", "timestamp-micros") and k == "long":
            return "timestamp", False
        if lt in ("local-timestamp-millis", "local-timestamp-micros") and k == "long":
            return "timestamp_ntz", False
    simple = {"boolean": "boolean", "int": "int", "long": "bigint", "float": "float",
              "double": "double", "string": "string", "enum": "string", "bytes": "binary",
              "fixed": "binary"}
    if k in simple:
        return simple[k], False
    if k == "array":
        return f"array<{spark_type(s['items'])[0]}>", False
    if k == "map":
        return f"map<string,{spark_type(s['values'])[0]}>", False
    if k == "record":
        inner = ",".join(f"{T.quote_name(f['name'])}:{spark_type(f['type'])[0]}"
                         for f in s["fields"])
        return T.parse_type(f"struct<{inner}>"), False
    raise UnsupportedType(f"Avro {describe(s)} has no Spark column type")


# --------------------------------------------------------------------------- resolution

@dataclass(frozen=True)
class Incompatibility:
    """Why a reader cannot read what a writer wrote: ``rule`` is the name Avro's Java
    library gives the case (``READER_FIELD_MISSING_DEFAULT_VALUE``...), ``path`` the field
    path from the top record (``order.items[]``), ``message`` says it in words."""

    rule: str
    path: str
    message: str


def incompatibilities(reader: Schema, writer: Schema) -> list[Incompatibility]:
    """Every reason why data written with ``writer`` cannot be read with ``reader`` (none:
    compatible), by Avro's schema resolution rules."""
    out: list[Incompatibility] = []
    _resolve(reader, writer, "", out, set())
    return out


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _names_match(r: dict[str, Any], w: dict[str, Any]) -> bool:
    return _short(r["name"]) == _short(w["name"]) or \
        any(_short(a) == _short(w["name"]) for a in r.get("aliases", ()))


def _at(path: str) -> str:
    return f"'{path}'" if path else "the top level"


def _reads(reader: Schema, writer: Schema, seen: set[tuple[int, int]]) -> bool:
    out: list[Incompatibility] = []
    # the pairs under resolution are shared: a recursive type is assumed readable where it
    # recurses (and judged by the rest of it)
    _resolve(reader, writer, "", out, seen)
    return not out


def _resolve(r: Schema, w: Schema, path: str, out: list[Incompatibility],
             seen: set[tuple[int, int]]) -> None:
    rk, wk = kind(r), kind(w)
    if wk == "union":
        # every branch the writer may have written must be readable
        for b in w:
            _resolve(r, b, path, out, seen)
        return
    if rk == "union":
        if not any(_reads(b, w, seen) for b in r):
            out.append(Incompatibility(
                "MISSING_UNION_BRANCH", path, f"at {_at(path)} the writer's {describe(w)} "
                f"is none of the reader's branches {describe(r)}"))
        return
    if rk != wk:
        if rk in PROMOTIONS.get(wk, ()):
            return
        out.append(Incompatibility(
            "TYPE_MISMATCH", path, f"at {_at(path)} the reader expects {describe(r)} where "
            f"the writer wrote {describe(w)}"))
        return
    if rk in NAMED:
        if not _names_match(r, w):
            out.append(Incompatibility(
                "NAME_MISMATCH", path, f"at {_at(path)} the reader's {rk} is named "
                f"'{r['name']}' and the writer's '{w['name']}'"))
            return
        key = (id(r), id(w))
        if key in seen:  # a recursive type: this pair is being resolved further up
            return
        seen.add(key)
    if rk == "fixed" and r["size"] != w["size"]:
        out.append(Incompatibility(
            "FIXED_SIZE_MISMATCH", path, f"at {_at(path)} the reader's fixed holds "
            f"{r['size']} bytes and the writer's {w['size']}"))
    elif rk == "enum":
        missing = [s for s in w["symbols"] if s not in r["symbols"]]
        if missing and "default" not in r:
            out.append(Incompatibility(
                "MISSING_ENUM_SYMBOLS", path, f"at {_at(path)} the writer's enum has "
                f"symbol(s) {', '.join(missing)} that the reader's lacks, and the reader's "
                "has no default"))
    elif rk == "array":
        _resolve(r["items"], w["items"], f"{path}[]", out, seen)
    elif rk == "map":
        _resolve(r["values"], w["values"], f"{path}{{}}", out, seen)
    elif rk == "record":
        wfields = {f["name"]: f for f in w["fields"]}
        for f in r["fields"]:
            sub = f"{path}.{f['name']}" if path else f["name"]
            wf = wfields.get(f["name"]) or next(
                (wfields[a] for a in f.get("aliases", ()) if a in wfields), None)
            if wf is not None:
                _resolve(f["type"], wf["type"], sub, out, seen)
            elif "default" not in f:
                out.append(Incompatibility(
                    "READER_FIELD_MISSING_DEFAULT_VALUE", sub,
                    f"the reader's field '{sub}' ({describe(f['type'])}) has no default, "
                    "and the writer's record has no such field"))


#: compatibility levels (the registry's names) and the directions each checks
LEVELS = {"BACKWARD": ("backward",), "FORWARD": ("forward",),
          "FULL": ("backward", "forward"), "NONE": ()}


def check_level(old: Schema, new: Schema, directions: Sequence[str]
                ) -> Iterator[tuple[str, Incompatibility]]:
    """``(direction, incompatibility)`` for a new schema replacing an old one: backward is
    the new schema reading data written with the old, forward the old reading the new."""
    for d in directions:
        reader, writer = (new, old) if d == "backward" else (old, new)
        for inc in incompatibilities(reader, writer):
            yield d, inc


def canonical(s: Schema) -> str:
    """The schema as compact JSON (named types written once, referenced by name after):
    what is registered, and what two schemas are compared by."""
    return json.dumps(to_doc(s), separators=(",", ":"), sort_keys=False)


def to_doc(s: Schema, done: set[str] | None = None) -> Any:
    done = set() if done is None else done
    k = kind(s)
    if k == "union":
        return [to_doc(b, done) for b in s]
    if isinstance(s, str):
        return s
    if k in NAMED:
        if s["name"] in done:
            return s["name"]
        done.add(s["name"])
        d: dict[str, Any] = {"type": k, "name": s["name"]}
        if s.get("aliases"):
            d["aliases"] = list(s["aliases"])
        if k == "record":
            fields = []
            for f in s["fields"]:
                fd: dict[str, Any] = {"name": f["name"], "type": to_doc(f["type"], done)}
                if "default" in f:
                    fd["default"] = f["default"]
                if f.get("aliases"):
                    fd["aliases"] = list(f["aliases"])
                fields.append(fd)
            d["fields"] = fields
        elif k == "enum":
            d["symbols"] = list(s["symbols"])
            if "default" in s:
                d["default"] = s["default"]
        else:
            d["size"] = s["size"]
        return d
    if k == "array":
        return {"type": "array", "items": to_doc(s["items"], done)}
    if k == "map":
        return {"type": "map", "values": to_doc(s["values"], done)}
    return dict(s)  # a primitive with a logical type


# --------------------------------------------------------------------------- plans

def subject_name(strategy: str, topic: str, record: str, key: bool = False) -> str:
    """The registry subject of a topic's values (or keys) under a subject name strategy."""
    if strategy == "record_name":
        return record
    if strategy == "topic_record_name":
        return f"{topic}-{record}"
    return f"{topic}-{'key' if key else 'value'}"


def columns_schema(record: str, columns: Sequence[tuple[str, str, bool]],
                   text: str | None, writing: bool = False) -> Schema:
    """The Avro record of a topic whose columns are ``(name, spark type, nullable)``: the
    schema ``text`` when the plan gives one (its fields must be the columns, each of a type
    that reads as the column's, or a wider one when ``writing`` the columns), else the
    record derived from the columns.

    Raises :class:`AvroSchemaError` whose ``schema_pointer`` is inside the schema, or
    :class:`ColumnMismatch` naming the column (its index in ``columns``)."""
    if text is None:
        for i, (n, t, _) in enumerate(columns):
            try:
                avro_type(t, f"{record}_{n}")
            except UnsupportedType as e:
                raise ColumnMismatch(str(e), i, expected="a type with an Avro counterpart",
                                     found=t) from None
        return parse(record_doc(record, columns))
    s = parse(text)
    if kind(s) != "record":
        raise AvroSchemaError("the schema of a topic's values is a record", "",
                              expected="a record", found=describe(s))
    fields = {f["name"]: (j, f) for j, f in enumerate(s["fields"])}
    for i, (n, t, _) in enumerate(columns):
        if n not in fields:
            raise ColumnMismatch(f"column '{n}' is not a field of the Avro record "
                                 f"'{s['name']}'", i, expected="one of " +
                                 ", ".join(fields), found=repr(n))
        j, f = fields[n]
        try:
            read, _ = spark_type(f["type"])
        except UnsupportedType as e:
            raise AvroSchemaError(str(e), f"/fields/{j}/type", expected="a type Spark reads",
                                  found=describe(f["type"])) from None
        want = T.parse_type(t)
        fits = T.can_widen(want, read) if writing else T.can_widen(read, want)
        if read != want and want != T.UNKNOWN and not fits:
            raise ColumnMismatch(f"field '{n}' of the Avro record is {describe(f['type'])}, "
                                 f"which reads as {read}", i, expected=want, found=read)
    names = {n for n, _, _ in columns}
    # a reader decodes a field it has no column for and drops it; a writer needs a value
    extra = [f["name"] for f in s["fields"] if f["name"] not in names and "default" not in f]
    if extra and writing:
        raise AvroSchemaError(f"field '{extra[0]}' of the Avro record is no column and has "
                              "no default", f"/fields/{fields[extra[0]][0]}",
                              expected="a column of that name, or a default",
                              found="neither")
    return s


class ColumnMismatch(PlanError):
    """A column the Avro schema does not give (``index`` is the column's position)."""

    def __init__(self, message: str, index: int = 0, **kw: object) -> None:
        self.index = index
        super().__init__(message, **kw)  # type: ignore[arg-type]
