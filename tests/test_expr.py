from __future__ import annotations

import pytest

from compat import expr as E
from compat.errors import ExpressionError


@pytest.mark.parametrize("a,b", [
    ("a+b", "A + b"),
    ("a + b", "b + a"),
    ("x > 3", "3 < X"),
    ("a AND b AND c", "c and (b and a)"),
    ("upper(Name) = 'Y'", "'Y' = UPPER(name)"),
    ("NOT NOT x", "x"),
    ("x IN (3, 1, 2)", "x in (1,2,3)"),
    ("lcase(s)", "lower(s)"),
    ("`Weird Col` > 1", "`weird col` > 1"),
    ("r.ts >= l.ts", "l.ts <= r.ts"),
    ("CAST(x AS INTEGER)", "cast(x as int)"),
    ("x::bigint", "CAST(x AS long)"),
])
def test_canonical_equal(a, b):
    assert E.canonical(a) == E.canonical(b)


@pytest.mark.parametrize("a,b", [
    ("a - b", "b - a"),
    ("x > 3", "x >= 3"),
    ("a / b", "b / a"),
    ("'A' = s", "'a' = s"),  # string literals keep their case
    ("a AND b", "a OR b"),
    ("count(x)", "count(DISTINCT x)"),
])
def test_canonical_different(a, b):
    assert E.canonical(a) != E.canonical(b)


@pytest.mark.parametrize("text,column", [("a +", 4), ("(a", 3), ("a b", 3), ("f(x,", 5)])
def test_syntax_errors_point_at_column(text, column):
    with pytest.raises(ExpressionError) as e:
        E.parse(text)
    assert e.value.column == column
    assert text in str(e.value)


@pytest.mark.parametrize("text", [
    "reflect('java.lang.Runtime', 'getRuntime')",
    "upper(java_method('java.lang.System', 'getenv', 'HOME'))",
    "try_reflect('a', 'b') IS NULL",
])
def test_java_calling_functions_are_refused(text):
    with pytest.raises(ExpressionError, match="arbitrary Java"):
        E.parse(text)


def test_subqueries_and_windows_are_refused():
    for text in ("x IN (SELECT 1)", "row_number() OVER (PARTITION BY a ORDER BY b)"):
        with pytest.raises(ExpressionError):
            E.parse(text)


def test_columns_exclude_lambda_parameters():
    ast = E.parse("transform(items, x -> x.price * qty)")
    assert E.columns(ast) == {("items",), ("qty",)}


def test_nondeterminism():
    assert not E.analyze("rand() < 0.5").deterministic
    assert not E.analyze("current_timestamp() > ts").deterministic
    assert E.analyze("amount > 3").deterministic


def test_types():
    scope = E.Scope({"a": "int", "b": "bigint", "d": "double", "s": "string",
                     "ts": "timestamp", "arr": "array<string>",
                     "st": "struct<x:int,y:string>"})
    def t(x):
        return E.infer_type(E.parse(x), scope)
    assert t("a + b") == "bigint"
    assert t("a + d") == "double"
    assert t("a / a") == "double"
    assert t("a > 1 AND s = 'x'") == "boolean"
    assert t("upper(s)") == "string"
    assert t("arr[0]") == "string"
    assert t("st.y") == "string"
    assert t("size(arr)") == "int"
    assert t("CASE WHEN a > 1 THEN a ELSE b END") == "bigint"
    assert t("coalesce(a, 0L)") == "bigint"
    assert t("ts + INTERVAL 5 MINUTES") == "timestamp"
    with pytest.raises(ExpressionError, match="column 'nope' does not exist"):
        t("nope + 1")


def test_shape_cache_shares_parses_but_keeps_errors_precise():
    a = E.shape("amount > 10 AND region = 'eu'")
    b = E.shape("amount > 99 AND region = 'us'")
    assert a is b
    with pytest.raises(ExpressionError) as e:
        E.shape("amount > 10 AND AND")
    assert "amount > 10 AND AND" in str(e.value)


@pytest.mark.parametrize("alphabet", ["'\\.`1234567890a_ x()\u0663", "0123456789'. a"])
def test_shape_key_is_the_literal_regex_with_placeholders(alphabet):
    # ``shape`` replaces literals in two passes of plain substitutions: the same text as
    # one pass of ``_LITERAL_RE`` calling ``_placeholder`` per literal
    import random

    rng = random.Random(7)
    for _ in range(20_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        assert E._NUMBER_RE.sub("1", E._STRING_RE.sub("'s'", text)) == \
            E._LITERAL_RE.sub(E._placeholder, text), text


def test_sqlglot_fallback_accepts_valid_spark_outside_the_subset():
    # a FILTER-free aggregate with an ORDER BY inside is outside our parser's subset
    ast = E.parse("array_sort(arr, (l, r) -> CASE WHEN l < r THEN -1 ELSE 1 END)")
    assert ast[0] in ("fn", "opaque")


def test_a_qualifier_named_like_an_ast_tag_is_a_name_not_a_call():
    """An input called ``FN`` (or ``col``): ```FN`.b`` is a column, not a call of b()
    (found by test_renaming_node_ids_never_changes_signatures drawing the id 'FN')."""
    from compat import expr as E

    for text, used in (("`AJ`.a > `FN`.b", set()), ("`col`.y + 1", set()),
                       ("upper(`fn`.b)", {"upper"})):
        assert E.functions(E.parse(text)) == used, text
    assert E.analyze("`FN`.b") is not None
