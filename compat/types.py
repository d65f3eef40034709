"""Spark SQL type strings: parsing to a canonical spelling, and widening rules.

Types are kept as canonical strings (``bigint``, ``array<string>``, ``struct<a:int>``,
``decimal(10,2)``): hashable, comparable, printable.  ``unknown`` stands for a type that could
not be inferred; it is compatible with everything so that the checker never raises a false alarm.

The parser follows Spark 4's ``dataType`` rule (``SqlBaseParser.g4``) and accepts what
``DataType.fromDDL`` accepts: case-insensitive names and their aliases, ``decimal(p[,s])``,
``char(n)``/``varchar(n)``, ``string collate <name>``, ``time[(p)]``, ``interval`` and the ANSI
interval types (``interval day to second``, ``interval year to month``), and struct fields
written ``name[:] type [NOT NULL] [COMMENT '...']`` with plain or backquoted names.  The
canonical spelling is Spark's ``simpleString`` with three differences: names are lower case
(Spark resolves them case-insensitively), a field name that is not a plain word keeps its
backquotes (so the canonical form parses back to itself), and ``char(n)``/``varchar(n)`` are
``string`` (what Spark reads them as).  A struct field's nullability and comment are dropped,
as ``simpleString`` drops them.  ``text``, ``bool``, ``null`` and ``char``/``varchar`` without a
length, which Spark refuses, are still read for plans written before this parser.
"""

from __future__ import annotations

import re
from typing import Any

UNKNOWN = "unknown"

_ALIASES = {
    "int": "int", "integer": "int", "long": "bigint", "bigint": "bigint",
    "short": "smallint", "smallint": "smallint", "byte": "tinyint", "tinyint": "tinyint",
    "float": "float", "real": "float", "double": "double", "string": "string",
    "varchar": "string", "char": "string", "character": "string",
    "boolean": "boolean", "timestamp": "timestamp",
    "timestamp_ltz": "timestamp", "timestamp_ntz": "timestamp_ntz", "date": "date",
    "time": "time", "binary": "binary", "decimal": "decimal", "dec": "decimal",
    "numeric": "decimal", "void": "void", "interval": "interval", "variant": "variant",
    "unknown": UNKNOWN,
    # not Spark's, read for plans written before the parser followed Spark's grammar
    "text": "string", "bool": "boolean", "null": "void",
}
#: Spark's ``type`` rule without a length: ``char`` and ``varchar`` need one there
_NO_LENGTH_NEEDED = {"text", "varchar", "char"}

INTEGRAL = ("tinyint", "smallint", "int", "bigint")
FRACTIONAL = ("float", "double")
MAX_PRECISION = 38  # Spark's DecimalType.MAX_PRECISION
#: array<array<...>> deeper than this is refused (and every type function recursing over it
#: stays far from Python's recursion limit)
MAX_TYPE_DEPTH = 100
MAX_TIME_PRECISION = 9  # Spark's TimeType: nanoseconds
DEFAULT_TIME_PRECISION = 6  # microseconds
_YEAR_MONTH = ("year", "month")
_DAY_TIME = ("day", "hour", "minute", "second")
_PLAIN_NAME = re.compile(r"[a-z0-9_]*[a-z_][a-z0-9_]*")

# kinds: w (word), n (number), p (punctuation), q (`quoted` name), s ('string' literal)
_TOKEN = re.compile(r"""\s*(?:(?P<n>\d+(?![A-Za-z0-9_]))|(?P<w>[A-Za-z0-9_]+)|(?P<p>[<>(),:])
                        |(?P<q>`(?:[^`]|``)*`)|(?P<s>'(?:[^'\\]|\\.|'')*'|"(?:[^"\\]|\\.)*"))""",
                    re.VERBOSE)


class TypeSyntaxError(ValueError):
    """A type string could not be parsed; ``args[0]`` says what was expected."""


def parse_type(text: str) -> str:
    """Return the canonical spelling of a Spark SQL type string, or raise TypeSyntaxError."""
    cached = _CACHE.get(text)
    if cached is not None:
        return cached
    p = _Parser(text)
    result = p.data_type()
    if p.pos != len(p.toks):
        raise TypeSyntaxError(f"unexpected '{p.toks[p.pos][1]}' in type '{text}'")
    _CACHE[text] = result
    return result


_CACHE: dict[str, str] = {}


def _tokenize(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise TypeSyntaxError(f"unexpected character '{text[pos]}' in type '{text}'")
        kind = m.lastgroup or "p"
        out.append((kind, m.group(kind)))
        pos = m.end()
    if not out:
        raise TypeSyntaxError("empty type")
    return out


def quote_name(name: str) -> str:
    """A struct field name as the canonical form writes it: backquoted unless a plain word."""
    return name if _PLAIN_NAME.fullmatch(name) else "`" + name.replace("`", "``") + "`"


class _Parser:
    """Recursive descent over Spark's ``dataType`` rule."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokenize(text)
        self.pos = 0
        self.depth = 0

    def peek(self, ahead: int = 0) -> tuple[str, str]:
        i = self.pos + ahead
        return self.toks[i] if i < len(self.toks) else ("end", "")

    def word(self, ahead: int = 0) -> str | None:
        kind, tok = self.peek(ahead)
        return tok.lower() if kind == "w" else None

    def expect(self, tok: str) -> None:
        kind, found = self.peek()
        if kind != "p" or found != tok:
            raise TypeSyntaxError(f"expected '{tok}' in type '{self.text}', found "
                                  f"'{found or 'end of type'}'")
        self.pos += 1

    def fail(self, what: str) -> TypeSyntaxError:
        found = self.peek()[1] or "end of type"
        return TypeSyntaxError(f"expected {what} in type '{self.text}', found '{found}'")

    def data_type(self) -> str:
        self.depth += 1
        if self.depth > MAX_TYPE_DEPTH:
            raise TypeSyntaxError(f"type '{self.text[:60]}' nests more than "
                                  f"{MAX_TYPE_DEPTH} levels of array, map and struct")
        try:
            return self._data_type()
        finally:
            self.depth -= 1

    def _data_type(self) -> str:
        word = self.word()
        if word is None:
            raise self.fail("a type")
        if word in ("array", "map", "struct") and self.peek(1) == ("p", "<"):
            self.pos += 2
            if word == "array":
                elem = self.data_type()
                self.expect(">")
                return f"array<{elem}>"
            if word == "map":
                key = self.data_type()
                self.expect(",")
                val = self.data_type()
                self.expect(">")
                return f"map<{key},{val}>"
            fields = []
            if self.peek() != ("p", ">"):
                fields.append(self.field())
                while self.peek() == ("p", ","):
                    self.pos += 1
                    fields.append(self.field())
            self.expect(">")
            return "struct<" + ",".join(fields) + ">"
        if word == "interval" and self.word(1) in _YEAR_MONTH + _DAY_TIME:
            return self.interval()
        base = _ALIASES.get(word)
        if base is None:
            raise TypeSyntaxError(f"unknown type '{self.peek()[1]}' in '{self.text}'")
        self.pos += 1
        nums = self.params()
        if base == "decimal":
            if len(nums) > 2:
                raise TypeSyntaxError(f"decimal takes a precision and a scale, in "
                                      f"'{self.text}'")
            p, s = (nums + [10, 0])[:2] if not nums else (nums + [0])[:2]
            if p > MAX_PRECISION or s > p:
                raise TypeSyntaxError(f"decimal({p},{s}) in '{self.text}': the precision is at "
                                      f"most {MAX_PRECISION} and the scale at most the "
                                      "precision")
            return f"decimal({p},{s})"
        if base == "time":
            if len(nums) > 1 or (nums and nums[0] > MAX_TIME_PRECISION):
                raise TypeSyntaxError(f"time takes one precision from 0 to "
                                      f"{MAX_TIME_PRECISION}, in '{self.text}'")
            return f"time({nums[0] if nums else DEFAULT_TIME_PRECISION})"
        if base == "string" and word != "string":
            if len(nums) != 1 and not (not nums and word in _NO_LENGTH_NEEDED):
                raise TypeSyntaxError(f"{word} takes one length, in '{self.text}'")
            return "string"  # varchar(10): Spark reads it as a string
        if nums:
            raise TypeSyntaxError(f"type {word} takes no parameters, in '{self.text}'")
        if base == "string" and self.word() == "collate":
            self.pos += 1
            name = self.word()
            if name is None:
                raise self.fail("a collation name")
            self.pos += 1
            return "string" if name == "utf8_binary" else f"string collate {name}"
        return base

    def params(self) -> list[int]:
        """``(n, ...)`` after a type name; [] without parentheses."""
        if self.peek() != ("p", "("):
            return []
        self.pos += 1
        nums: list[int] = []
        while True:
            kind, tok = self.peek()
            if kind != "n":
                raise self.fail("a number")
            if len(tok.lstrip("0")) > 9:  # no precision or length of Spark's is that long
                raise TypeSyntaxError(f"number {tok[:12]}{'...' if len(tok) > 12 else ''} "
                                      f"too large in type '{self.text[:60]}'")
            nums.append(int(tok))
            self.pos += 1
            if self.peek() != ("p", ","):
                break
            self.pos += 1
        self.expect(")")
        return nums

    def interval(self) -> str:
        """``interval <from> [to <to>]``: a year-month or a day-time interval type."""
        self.pos += 1
        start = self.word() or ""
        self.pos += 1
        units = _YEAR_MONTH if start in _YEAR_MONTH else _DAY_TIME
        if self.word() != "to":
            return f"interval {start}"
        self.pos += 1
        end = self.word()
        later = units[units.index(start) + 1:]
        if end not in later:
            if not later:
                raise TypeSyntaxError(f"'interval {start}' is the smallest unit of its kind: "
                                      f"nothing can follow TO, in '{self.text}'")
            raise self.fail(f"{' or '.join(later)} after 'interval {start} to'")
        self.pos += 1
        return f"interval {start} to {end}"

    def field(self) -> str:
        """``name [:] type [NOT NULL] [COMMENT '...']``: written ``name:type``."""
        kind, tok = self.peek()
        if kind == "w":
            name = tok
        elif kind == "q":
            name = tok[1:-1].replace("``", "`")
        else:
            raise self.fail("a field name")
        self.pos += 1
        if self.peek() == ("p", ":"):
            self.pos += 1
        ftype = self.data_type()
        if self.word() == "not":
            self.pos += 1
            if self.word() != "null":
                raise self.fail("NULL after NOT")
            self.pos += 1
        if self.word() == "comment":
            self.pos += 1
            if self.peek()[0] != "s":
                raise self.fail("a string after COMMENT")
            self.pos += 1
        return f"{quote_name(name.lower())}:{ftype}"


def decimal_ps(t: str) -> tuple[int, int] | None:
    if t.startswith("decimal("):
        p, s = t[8:-1].split(",")
        return int(p), int(s)
    return None


def is_numeric(t: str) -> bool:
    return t in INTEGRAL or t in FRACTIONAL or t.startswith("decimal(")


def split_top(inner: str) -> list[str]:
    """Split ``a:int,b:map<string,int>`` at top-level commas (not inside `quoted` names)."""
    parts, depth, start, quoted = [], 0, 0, False
    for i, ch in enumerate(inner):
        if ch == "`":
            quoted = not quoted  # a doubled `` toggles twice
        elif quoted:
            continue
        elif ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
    if inner[start:]:
        parts.append(inner[start:])
    return parts


def struct_fields(t: str) -> list[tuple[str, str]]:
    """The (name, type) pairs of a canonical struct type; names without their backquotes."""
    if not t.startswith("struct<"):
        return []
    out = []
    for part in split_top(t[7:-1]):
        if part.startswith("`"):
            end = 1
            while True:
                end = part.index("`", end)
                if part[end + 1:end + 2] != "`":
                    break
                end += 2
            name, ftype = part[1:end].replace("``", "`"), part[end + 2:]
        else:
            name, _, ftype = part.partition(":")
        out.append((name, ftype))
    return out


def array_element(t: str) -> str:
    if t.startswith("array<"):
        return t[6:-1]
    return UNKNOWN


def map_kv(t: str) -> tuple[str, str]:
    if t.startswith("map<"):
        k, v = split_top(t[4:-1])
        return k, v
    return UNKNOWN, UNKNOWN


def can_widen(old: str, new: str) -> bool:
    """True when a reader expecting ``old`` can read values written as ``new``... in JSON.

    ``new`` must be the same type as ``old`` or a wider one (int -> bigint, float -> double).
    """
    if old == new or UNKNOWN in (old, new) or old == "void":
        return True
    if old in INTEGRAL and new in INTEGRAL:
        return INTEGRAL.index(new) >= INTEGRAL.index(old)
    if old in INTEGRAL and (new in FRACTIONAL or new.startswith("decimal(")):
        if new.startswith("decimal("):
            p, s = decimal_ps(new)  # type: ignore[misc]
            return p - s >= {"tinyint": 3, "smallint": 5, "int": 10, "bigint": 20}[old]
        return new == "double"
    if old == "float" and new == "double":
        return True
    if old.startswith("decimal(") and new.startswith("decimal("):
        (p1, s1), (p2, s2) = decimal_ps(old), decimal_ps(new)  # type: ignore[misc]
        return s2 >= s1 and p2 - s2 >= p1 - s1
    if old.startswith("decimal(") and new == "double":
        return True
    if old == "date" and new == "timestamp":
        return True
    if old.startswith("array<") and new.startswith("array<"):
        return can_widen(array_element(old), array_element(new))
    if old.startswith("map<") and new.startswith("map<"):
        (k1, v1), (k2, v2) = map_kv(old), map_kv(new)
        return can_widen(k1, k2) and can_widen(v1, v2)
    if old.startswith("struct<") and new.startswith("struct<"):
        newf = dict(struct_fields(new))
        return all(n in newf and can_widen(t, newf[n]) for n, t in struct_fields(old))
    return False


def wider(a: str, b: str) -> str:
    """The common type Spark would coerce ``a`` and ``b`` to (best effort)."""
    if a == b:
        return a
    if a in (UNKNOWN, "void"):
        return b
    if b in (UNKNOWN, "void"):
        return a
    if can_widen(a, b):
        return b
    if can_widen(b, a):
        return a
    if is_numeric(a) and is_numeric(b):
        return "double"
    if "string" in (a, b):
        return "string"
    return UNKNOWN


def same_layout(a: str, b: str) -> bool:
    """Equal for state purposes (Spark compares state schemas ignoring field names)."""
    if a == b or UNKNOWN in (a, b):
        return True
    if a.startswith("struct<") and b.startswith("struct<"):
        fa, fb = struct_fields(a), struct_fields(b)
        return len(fa) == len(fb) and all(same_layout(x[1], y[1]) for x, y in zip(fa, fb))
    return False


# -- Spark's JSON types as text ------------------------------------------------------------

_JSON_SIMPLE = {"integer": "int", "long": "bigint", "short": "smallint", "byte": "tinyint"}


def type_string(t: Any) -> str:
    """A Spark type as Spark writes it in JSON (a checkpoint's state schemas, a Parquet
    footer) as Spark SQL type text (``struct<k:string,n:bigint>``)."""
    if isinstance(t, str):
        return _JSON_SIMPLE.get(t, t)
    if not isinstance(t, dict):
        return str(t)
    kind = t.get("type")
    if kind == "struct":
        return "struct<" + ",".join(f"{f.get('name')}:{type_string(f.get('type'))}"
                                    for f in t.get("fields", [])) + ">"
    if kind == "array":
        return f"array<{type_string(t.get('elementType'))}>"
    if kind == "map":
        return f"map<{type_string(t.get('keyType'))},{type_string(t.get('valueType'))}>"
    if kind == "udt":
        return str(t.get("class") or t.get("pyClass") or "udt")
    return str(kind)
