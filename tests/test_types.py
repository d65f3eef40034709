from __future__ import annotations

import pytest

from compat import types as T


@pytest.mark.parametrize("text,canon", [
    ("INT", "int"), ("integer", "int"), ("long", "bigint"), ("STRING", "string"),
    ("varchar(10)", "string"), ("decimal", "decimal(10,0)"), ("DECIMAL(12, 2)", "decimal(12,2)"),
    ("array<INT>", "array<int>"), ("map<string, array<bigint>>", "map<string,array<bigint>>"),
    ("struct<A:int, b:string>", "struct<a:int,b:string>"),
])
def test_parse_type(text, canon):
    assert T.parse_type(text) == canon


@pytest.mark.parametrize("bad", ["", "strin", "array<int", "map<int>", "struct<a int>"])
def test_bad_types(bad):
    with pytest.raises(T.TypeSyntaxError):
        T.parse_type(bad)


@pytest.mark.parametrize("old,new,ok", [
    ("int", "bigint", True), ("bigint", "int", False), ("float", "double", True),
    ("double", "float", False), ("int", "string", False), ("int", "double", True),
    ("decimal(10,2)", "decimal(12,2)", True), ("decimal(10,2)", "decimal(10,3)", False),
    ("array<int>", "array<bigint>", True), ("struct<a:int>", "struct<a:int,b:string>", True),
    ("struct<a:int,b:string>", "struct<a:int>", False), ("date", "timestamp", True),
])
def test_can_widen(old, new, ok):
    assert T.can_widen(old, new) is ok
