"""Spark SQL type strings: parsing to a canonical spelling, and widening rules.

Types are kept as canonical strings (``bigint``, ``array<string>``, ``struct<a:int>``,
``decimal(10,2)``): hashable, comparable, printable.  ``unknown`` stands for a type that could
not be inferred; it is compatible with everything so that the checker never raises a false alarm.
"""

from __future__ import annotations

import re

UNKNOWN = "unknown"

_ALIASES = {
    "int": "int", "integer": "int", "long": "bigint", "bigint": "bigint",
    "short": "smallint", "smallint": "smallint", "byte": "tinyint", "tinyint": "tinyint",
    "float": "float", "real": "float", "double": "double", "string": "string",
    "varchar": "string", "char": "string", "text": "string",
    "boolean": "boolean", "bool": "boolean", "timestamp": "timestamp",
    "timestamp_ltz": "timestamp", "timestamp_ntz": "timestamp_ntz", "date": "date",
    "binary": "binary", "decimal": "decimal", "dec": "decimal", "numeric": "decimal",
    "void": "void", "null": "void", "interval": "interval", "unknown": UNKNOWN,
}

INTEGRAL = ("tinyint", "smallint", "int", "bigint")
FRACTIONAL = ("float", "double")
_TOKEN = re.compile(r"\s*(?:([A-Za-z_][A-Za-z0-9_]*)|(\d+)|([<>(),:])|(`[^`]*`))")


class TypeSyntaxError(ValueError):
    """A type string could not be parsed; ``args[0]`` says what was expected."""


def parse_type(text: str) -> str:
    """Return the canonical spelling of a Spark SQL type string, or raise TypeSyntaxError."""
    cached = _CACHE.get(text)
    if cached is not None:
        return cached
    tokens = _tokenize(text)
    pos, result = _parse(tokens, 0, text)
    if pos != len(tokens):
        raise TypeSyntaxError(f"unexpected '{tokens[pos]}' in type '{text}'")
    _CACHE[text] = result
    return result


_CACHE: dict[str, str] = {}


def _tokenize(text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise TypeSyntaxError(f"unexpected character '{text[pos]}' in type '{text}'")
        out.append(m.group(0).strip())
        pos = m.end()
    if not out:
        raise TypeSyntaxError("empty type")
    return out


def _parse(tokens: list[str], pos: int, text: str) -> tuple[int, str]:
    if pos >= len(tokens):
        raise TypeSyntaxError(f"type '{text}' ends early")
    word = tokens[pos].lower()
    if word in ("array", "map", "struct") and pos + 1 < len(tokens) and tokens[pos + 1] == "<":
        pos += 2
        if word == "array":
            pos, elem = _parse(tokens, pos, text)
            pos = _expect(tokens, pos, ">", text)
            return pos, f"array<{elem}>"
        if word == "map":
            pos, key = _parse(tokens, pos, text)
            pos = _expect(tokens, pos, ",", text)
            pos, val = _parse(tokens, pos, text)
            pos = _expect(tokens, pos, ">", text)
            return pos, f"map<{key},{val}>"
        fields = []
        while pos < len(tokens) and tokens[pos] != ">":
            name = tokens[pos].strip("`").lower()
            pos = _expect(tokens, pos + 1, ":", text)
            pos, ftype = _parse(tokens, pos, text)
            fields.append(f"{name}:{ftype}")
            if pos < len(tokens) and tokens[pos] == ",":
                pos += 1
        pos = _expect(tokens, pos, ">", text)
        return pos, "struct<" + ",".join(fields) + ">"
    base = _ALIASES.get(word)
    if base is None:
        raise TypeSyntaxError(f"unknown type '{tokens[pos]}' in '{text}'")
    pos += 1
    if pos < len(tokens) and tokens[pos] == "(":
        nums = []
        pos += 1
        while pos < len(tokens) and tokens[pos] != ")":
            if not tokens[pos].isdigit():
                raise TypeSyntaxError(f"expected a number in '{text}'")
            nums.append(int(tokens[pos]))
            pos += 1
            if pos < len(tokens) and tokens[pos] == ",":
                pos += 1
        pos = _expect(tokens, pos, ")", text)
        if base == "decimal":
            p, s = (nums + [10, 0])[:2] if len(nums) < 2 else nums[:2]
            if len(nums) == 1:
                s = 0
            return pos, f"decimal({p},{s})"
        return pos, base  # varchar(10) -> string
    if base == "decimal":
        return pos, "decimal(10,0)"
    return pos, base


def _expect(tokens: list[str], pos: int, tok: str, text: str) -> int:
    if pos >= len(tokens) or tokens[pos] != tok:
        found = tokens[pos] if pos < len(tokens) else "end of type"
        raise TypeSyntaxError(f"expected '{tok}' in type '{text}', found '{found}'")
    return pos + 1


def decimal_ps(t: str) -> tuple[int, int] | None:
    if t.startswith("decimal("):
        p, s = t[8:-1].split(",")
        return int(p), int(s)
    return None


def is_numeric(t: str) -> bool:
    return t in INTEGRAL or t in FRACTIONAL or t.startswith("decimal(")


def split_top(inner: str) -> list[str]:
    """Split ``a:int,b:map<string,int>`` at top-level commas."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(inner):
        if ch in "<(":
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
    if not t.startswith("struct<"):
        return []
    out = []
    for part in split_top(t[7:-1]):
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
