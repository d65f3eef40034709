"""What Spark's analyzer refuses under ANSI mode (``spark.sql.ansi.enabled``, on by default
in Spark 4), for the expressions ``compat.expr`` types.

Each function takes the types ``compat.expr.infer_type`` inferred for an operator's or a
function's operands and returns ``None`` when Spark accepts them, or a ``Refusal`` saying
why not; ``compat.expr`` turns it into an ExpressionError naming the sub-expression.  Every
rule was checked against Spark 4.3 (``SELECT <expr> FROM VALUES ...`` in a local session):
``tests/test_ansi_types.py`` holds the table of what Spark accepts and refuses, and
``tests/integration/test_ansi_spark.py`` runs that table on Spark.

Only what is known is refused: an operand whose type could not be inferred (``unknown``),
``NULL`` (``void``), intervals and the types the rules do not cover pass, so the checker never
refuses what Spark runs.  Two things ANSI mode still allows are easy to mistake: a string is
implicitly cast in arithmetic and comparisons (``'1' + 1``, ``s = 1``, ``ts > '2020-01-01'``),
and ``sum``/``avg`` accept strings and timestamps.
"""

from __future__ import annotations

from typing import NamedTuple

from compat import types as T


class Refusal(NamedTuple):
    why: str
    expected: str
    found: str


def kind(t: str) -> str:
    """The family of a type, as Spark's type coercion sees it; ``?`` when no rule applies."""
    if t in T.INTEGRAL:
        return "integral"
    if t in T.FRACTIONAL:
        return "fractional"
    if t.startswith("decimal("):
        return "decimal"
    if t in ("string", "boolean", "date", "binary"):
        return t
    if t in ("timestamp", "timestamp_ntz"):
        return "timestamp"
    if t == "void":
        return "null"
    for complex_kind in ("array", "map", "struct"):
        if t.startswith(complex_kind + "<"):
            return complex_kind
    return "?"  # unknown, interval, time, variant...


NUMERIC = frozenset({"integral", "fractional", "decimal"})
DATETIME = frozenset({"timestamp", "date"})
COMPLEX = frozenset({"array", "map", "struct"})
#: what a condition (AND, OR, NOT, IS TRUE) takes: a string is cast to boolean
_BOOLEANISH = frozenset({"boolean", "string", "null", "?"})
_LENIENT = frozenset({"null", "?"})
_BITS = frozenset({"integral", "string"}) | _LENIENT


def _group(k: str) -> str:
    if k in NUMERIC:
        return "numeric"
    if k in DATETIME:
        return "datetime"
    return k


def _pair(lt: str, rt: str) -> str:
    return f"{lt} and {rt}"


def common(a: str, b: str) -> bool:
    """Spark finds a common type for ``a`` and ``b`` (CASE branches, COALESCE, IN lists):
    the same family, or a string with a scalar (the string is cast)."""
    ka, kb = kind(a), kind(b)
    if ka in _LENIENT or kb in _LENIENT:
        return True
    if _group(ka) == _group(kb):
        return True
    return "string" in (ka, kb) and not ({ka, kb} & COMPLEX)


def comparable(a: str, b: str) -> bool:
    """``a = b``, ``a < b``: a common type, and not a map (maps have no equality)."""
    return common(a, b) and "map" not in (kind(a), kind(b))


# -- operators ---------------------------------------------------------------------------------


def binary(op: str, lt: str, rt: str) -> Refusal | None:
    lk, rk = kind(lt), kind(rt)
    if op in ("and", "or"):
        if lk not in _BOOLEANISH or rk not in _BOOLEANISH:
            return Refusal(f"{op.upper()} joins conditions", "boolean operands",
                           _pair(lt, rt))
        return None
    if op in ("=", "!=", "<=>", "<", "<=", ">", ">="):
        if not comparable(lt, rt):
            return Refusal(f"'{op}' compares values of incompatible types",
                           "comparable types (a string is cast to the other side)",
                           _pair(lt, rt))
        return None
    if op in ("&", "|", "^"):
        if lk not in _BITS or rk not in _BITS:
            return Refusal(f"bitwise '{op}' needs integers", "integral operands",
                           _pair(lt, rt))
        return None
    if op in ("+", "-", "*", "/", "%", "div"):
        return _arithmetic(op, lt, rt, lk, rk)
    return None


_NOT_NUMBERS = frozenset({"boolean", "binary"}) | COMPLEX
_DATE_DAYS = frozenset({"int", "smallint", "tinyint"})


def _arithmetic(op: str, lt: str, rt: str, lk: str, rk: str) -> Refusal | None:
    if lk in _LENIENT or rk in _LENIENT:
        return None
    bad = Refusal(f"'{op}' needs numbers", "numeric operands (or a date plus days, a "
                  "timestamp plus an interval)", _pair(lt, rt))
    if lk in _NOT_NUMBERS or rk in _NOT_NUMBERS:
        return bad
    if op in ("+", "-"):
        if "timestamp" in (lk, rk):
            # a timestamp moves by an interval; ts - ts and ts - date are intervals
            other = rk if lk == "timestamp" else lk
            if other in NUMERIC or (op == "+" and other in ("timestamp", "string")):
                return bad
        elif "date" in (lk, rk):
            return _date_arithmetic(op, lt, rt, lk, rk, bad)
        return None
    if lk in DATETIME or rk in DATETIME:
        return bad
    if op == "div" and "fractional" in (lk, rk):
        return Refusal("'div' is integer division", "integral or decimal operands",
                       _pair(lt, rt))
    return None


def _date_arithmetic(op: str, lt: str, rt: str, lk: str, rk: str,
                     bad: Refusal) -> Refusal | None:
    """date + n and date - n are date_add/date_sub (n an int, smallint or tinyint); date -
    date and date - 'yyyy-mm-dd' are intervals; n - date and date + date mean nothing."""
    if lk != "date":
        if op == "-":
            return bad if lk in NUMERIC else None
        other, ot = lk, lt
    else:
        other, ot = rk, rt
    if other == "date":
        return bad if op == "+" else None
    if op == "-" and other == "string":
        return None
    if other in NUMERIC | {"string"} and ot not in _DATE_DAYS:
        return Refusal(f"a date {op} days needs an int number of days",
                       "int, smallint or tinyint", ot)
    return None


def unary(op: str, t: str) -> Refusal | None:
    k = kind(t)
    if op == "not" and k not in _BOOLEANISH:
        return Refusal("NOT negates a condition", "a boolean", t)
    if op == "neg" and (k in _NOT_NUMBERS or k in DATETIME):
        return Refusal("'-' negates a number", "a numeric operand", t)
    if op == "~" and k not in {"integral"} | _LENIENT:
        return Refusal("'~' needs an integer", "an integral operand", t)
    return None


def is_truth(t: str) -> Refusal | None:
    """``x IS [NOT] TRUE|FALSE``."""
    if kind(t) not in _BOOLEANISH:
        return Refusal("IS TRUE/FALSE tests a condition", "a boolean", t)
    return None


def condition(t: str, where: str) -> Refusal | None:
    """A CASE WHEN's condition: a boolean, not a string nor NULL (Spark casts neither)."""
    if kind(t) not in ("boolean", "?"):
        return Refusal(f"{where} must be a condition", "boolean", t)
    return None


def all_common(types: list[str], what: str, compare: bool = False) -> Refusal | None:
    """Every pair of ``types`` has a common type (``compare``: and can be compared)."""
    check = comparable if compare else common
    for i, a in enumerate(types):
        for b in types[i + 1:]:
            if not check(a, b):
                return Refusal(f"{what} mixes incompatible types", "types with a common "
                               "type (a string is cast to the other)", _pair(a, b))
    return None


def cast(src: str, dst: str) -> Refusal | None:
    """``CAST(x AS t)``: Spark's ANSI cast table, for the families checked against Spark."""
    sk, dk = kind(src), kind(dst)
    if sk in _LENIENT or dk in _LENIENT:
        return None
    bad = Refusal(f"Spark cannot cast {src} to {dst}", "a cast Spark allows under ANSI mode "
                  "(a function such as to_date or unix_seconds may do it)", f"{src} to {dst}")
    if sk in COMPLEX:
        return None if dk in (sk, "string") else bad
    if dk in COMPLEX:
        return bad
    if sk == "date" and (dk in NUMERIC or dk == "boolean"):
        return bad
    if sk == "boolean" and dk in DATETIME:
        return bad
    if sk == "timestamp" and dk == "boolean":
        return bad
    if sk in NUMERIC and dk == "date":
        return bad
    if dk == "binary" and sk not in ("string", "binary"):
        return bad
    if sk == "binary" and dk in NUMERIC:
        return bad
    return None


def index(base: str, idx: str) -> Refusal | None:
    """``x[i]``: an array (with an integer index), a map or a struct."""
    bk, ik = kind(base), kind(idx)
    if bk in _LENIENT:
        return None
    if bk not in COMPLEX:
        return Refusal("only an array, a map or a struct has elements",
                       "array, map or struct", base)
    if bk == "array" and ik not in {"integral"} | _LENIENT:
        return Refusal("an array index is an integer", "an integral index", idx)
    return None


def field(base: str, name: str) -> Refusal | None:
    """``x.name`` on a value that is not a column path."""
    bk = kind(base)
    if bk in _LENIENT or bk in ("map", "array"):
        return None
    if bk != "struct":
        return Refusal("only a struct has fields", "a struct", base)
    if name not in dict(T.struct_fields(base)):
        return Refusal(f"the struct has no field '{name}'",
                       "one of " + ", ".join(n for n, _ in T.struct_fields(base)), repr(name))
    return None


# -- functions ---------------------------------------------------------------------------------

_MATH = frozenset({
    "abs", "sqrt", "exp", "ln", "log", "log10", "log2", "pow", "sin", "cos", "tan", "asin",
    "acos", "atan", "atan2", "degrees", "radians", "cbrt", "signum", "sign", "floor", "ceil",
    "negative", "positive", "expm1", "log1p", "sinh", "cosh", "tanh", "cot", "hypot",
})
_MATH_FIRST = frozenset({"round", "bround"})
_DATE_PARTS = frozenset({
    "year", "month", "dayofmonth", "hour", "minute", "second", "dayofweek", "dayofyear",
    "weekofyear", "quarter", "add_months", "last_day", "next_day", "date_add", "date_sub",
})
_TEXT = frozenset({"upper", "lower", "substr", "length", "bit_length", "octet_length"})
_ARRAY = frozenset({"array_contains", "sort_array", "array_distinct", "array_size",
                    "array_max", "array_min", "array_position", "array_remove", "array_join"})
_ARRAY_OR_MAP = frozenset({"size", "cardinality", "element_at", "explode", "explode_outer",
                           "posexplode", "posexplode_outer"})
_SUM = frozenset({"sum", "avg", "try_sum", "try_avg"})
_MOMENTS = frozenset({"stddev", "stddev_pop", "variance", "var_pop", "skewness", "kurtosis",
                      "median", "corr", "covar_pop", "covar_samp"})
_BOOL_AGGS = frozenset({"bool_and", "bool_or", "count_if"})
_BIT_AGGS = frozenset({"bit_and", "bit_or", "bit_xor"})


def _needs(name: str, what: str, t: str) -> Refusal:
    return Refusal(f"{name}() takes {what}", what, t)


def call(name: str, types: list[str]) -> Refusal | None:  # noqa: C901 - one table
    """A function call with arguments of ``types`` (lambdas and ``*`` are ``unknown``)."""
    kinds = [kind(t) for t in types]
    first, fk = (types[0], kinds[0]) if types else (T.UNKNOWN, "?")
    numberish = NUMERIC | {"string"} | _LENIENT
    if name in _MATH or name in _MATH_FIRST:
        for t, k in zip(types if name in _MATH else types[:1], kinds):
            if k not in numberish:
                return _needs(name, "numbers", t)
    elif name in _DATE_PARTS or name == "datediff":
        for t, k in zip(types if name == "datediff" else types[:1], kinds):
            if k not in DATETIME | {"string"} | _LENIENT:
                return _needs(name, "a date or a timestamp", t)
        if name in ("date_add", "date_sub") and len(types) > 1 and \
                kinds[1] not in {"string"} | _LENIENT and types[1] not in _DATE_DAYS:
            return Refusal(f"{name}() adds an int number of days", "int, smallint or "
                           "tinyint", types[1])
    elif name in _TEXT:
        if fk in COMPLEX:
            return _needs(name, "a string", first)
    elif name in _ARRAY:
        if fk not in {"array"} | _LENIENT:
            return _needs(name, "an array", first)
        if name == "array_contains" and fk == "array" and len(types) > 1:
            element, value = kind(T.array_element(first)), kinds[1]
            if value == "null":
                return Refusal("array_contains() cannot look for NULL", "a typed value "
                               "(CAST(NULL AS ...))", "NULL")
            if element not in _LENIENT and value not in _LENIENT and \
                    _group(element) != _group(value):  # no string is cast here
                return Refusal("array_contains() looks for a value of the array's element "
                               "type", T.array_element(first), types[1])
    elif name in _ARRAY_OR_MAP:
        if fk not in {"array", "map"} | _LENIENT:
            return _needs(name, "an array or a map", first)
    elif name == "concat":
        complex_args = [t for t, k in zip(types, kinds) if k in COMPLEX]
        if complex_args and len(complex_args) < sum(k not in _LENIENT for k in kinds):
            return Refusal("concat() joins strings or arrays, not both",
                           "all strings or all arrays", ", ".join(types))
    elif name == "if":
        if fk not in ("boolean", "null", "?"):
            return Refusal("if()'s first argument is a condition", "boolean", first)
        return all_common(types[1:], "if()")
    elif name in ("coalesce", "ifnull"):
        return all_common(types, f"{name}()")
    elif name == "nvl2":
        return all_common(types[1:], "nvl2()")
    elif name == "nullif":
        return all_common(types, "nullif()", compare=True)
    elif name in ("greatest", "least"):
        groups = {_group(k) for k in kinds if k not in _LENIENT}
        if len(groups) > 1:
            return Refusal(f"{name}() compares values of one type (no string is cast)",
                           "arguments of one type family", ", ".join(types))
    elif name in _SUM:
        if fk in _NOT_NUMBERS or fk == "date":
            return _needs(name, "numbers", first)
    elif name in _MOMENTS:
        for t, k in zip(types[:2], kinds):
            if k not in numberish:
                return _needs(name, "numbers", t)
    elif name in _BOOL_AGGS:
        if fk not in _BOOLEANISH:
            return _needs(name, "conditions", first)
    elif name in _BIT_AGGS:
        if fk not in {"integral"} | _LENIENT:
            return _needs(name, "integers", first)
    elif name in ("min", "max", "collect_set"):
        if fk == "map":
            return _needs(name, "values that can be ordered or compared (not a map)", first)
    elif name in ("max_by", "min_by"):
        if len(kinds) > 1 and kinds[1] == "map":
            return _needs(name, "an ordering that is not a map", types[1])
    elif name in ("percentile_approx", "approx_percentile"):
        if fk in {"boolean"} | COMPLEX:
            return _needs(name, "numbers, dates or timestamps", first)
    return None
