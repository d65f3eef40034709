"""Spark SQL type strings: what Spark 4's DDL parser accepts, read to Theseus's canonical form.

The table below is the specification: each row says how Spark spells a type
(``DataType.fromDDL(t).simpleString()``) and how Theseus does.  The unit tests check Theseus's
column; ``tests/integration/test_types_spark.py`` checks Spark's column, and the refusals,
against a real Spark.
"""

from __future__ import annotations

import pytest

from compat import types as T

# (type as written, Spark 4's DataType.fromDDL(t).simpleString(), Theseus's canonical form)
SPARK_TYPES = [
    # names and aliases, any case
    ("INT", "int", "int"), ("integer", "int", "int"), ("long", "bigint", "bigint"),
    ("byte", "tinyint", "tinyint"), ("Short", "smallint", "smallint"),
    ("real", "float", "float"), ("STRING", "string", "string"),
    ("boolean", "boolean", "boolean"), ("binary", "binary", "binary"), ("date", "date", "date"),
    ("void", "void", "void"), ("timestamp_ltz", "timestamp", "timestamp"),
    ("TIMESTAMP_NTZ", "timestamp_ntz", "timestamp_ntz"), ("variant", "variant", "variant"),
    ("  int  ", "int", "int"),
    # parameters
    ("decimal", "decimal(10,0)", "decimal(10,0)"),
    ("decimal(5)", "decimal(5,0)", "decimal(5,0)"),
    ("DECIMAL(12, 2)", "decimal(12,2)", "decimal(12,2)"),
    ("dec(4,2)", "decimal(4,2)", "decimal(4,2)"),
    ("numeric(38,38)", "decimal(38,38)", "decimal(38,38)"),
    ("decimal(0,0)", "decimal(0,0)", "decimal(0,0)"),
    ("varchar(10)", "varchar(10)", "string"), ("char(3)", "char(3)", "string"),
    ("character(3)", "char(3)", "string"),
    ("time", "time(6)", "time(6)"), ("time(0)", "time(0)", "time(0)"),
    ("time(9)", "time(9)", "time(9)"),
    ("string collate utf8_lcase", "string collate UTF8_LCASE", "string collate utf8_lcase"),
    ("STRING COLLATE UTF8_BINARY", "string", "string"),
    # intervals
    ("interval", "interval", "interval"),
    ("interval day to second", "interval day to second", "interval day to second"),
    ("INTERVAL Year To Month", "interval year to month", "interval year to month"),
    ("interval year", "interval year", "interval year"),
    ("interval month", "interval month", "interval month"),
    ("interval day to hour", "interval day to hour", "interval day to hour"),
    ("interval hour to minute", "interval hour to minute", "interval hour to minute"),
    ("interval minute to second", "interval minute to second", "interval minute to second"),
    ("interval second", "interval second", "interval second"),
    # containers
    ("array<INT>", "array<int>", "array<int>"),
    ("map<string, array<bigint>>", "map<string,array<bigint>>", "map<string,array<bigint>>"),
    ("struct<A:int, b:string>", "struct<A:int,b:string>", "struct<a:int,b:string>"),
    ("struct<a int>", "struct<a:int>", "struct<a:int>"),
    ("STRUCT<a: int, b string>", "struct<a:int,b:string>", "struct<a:int,b:string>"),
    ("struct<a : int>", "struct<a:int>", "struct<a:int>"),
    ("struct<>", "struct<>", "struct<>"),
    ("struct<a int NOT NULL, b string COMMENT 'the b', c int not null comment \"c\">",
     "struct<a:int,b:string,c:int>", "struct<a:int,b:string,c:int>"),
    ("struct<a int comment 'it''s', b int comment 'it\\'s'>", "struct<a:int,b:int>",
     "struct<a:int,b:int>"),
    ("struct<`a`:int, `B c`: string>", "struct<a:int,B c:string>",
     "struct<a:int,`b c`:string>"),
    ("struct<`a,b`:int>", "struct<a,b:int>", "struct<`a,b`:int>"),
    ("struct<`a``b`:int>", "struct<a`b:int>", "struct<`a``b`:int>"),
    ("struct<1a:int>", "struct<1a:int>", "struct<1a:int>"),
    ("struct<int int, struct struct<not int not null>>",
     "struct<int:int,struct:struct<not:int>>", "struct<int:int,struct:struct<not:int>>"),
    ("array<struct<a int, b map<string, decimal(5)>>>",
     "array<struct<a:int,b:map<string,decimal(5,0)>>>",
     "array<struct<a:int,b:map<string,decimal(5,0)>>>"),
    ("struct<a string collate utf8_lcase, d interval day, t interval>",
     "struct<a:string collate UTF8_LCASE,d:interval day,t:interval>",
     "struct<a:string collate utf8_lcase,d:interval day,t:interval>"),
]

# Types Spark's DDL parser refuses (checked against Spark in the same integration test)
SPARK_REFUSES = [
    "strin", "array<int", "map<int>", "struct<a:int,>", "struct<a int,,b int>",
    "struct<a:>", "struct<:int>", "struct<1:int>", "array<int not null>",
    "struct<a int not null not null>", "struct<a int comment 'x' not null>",
    "struct<a int null>", "struct<a int comment>", "struct<a-b int>",
    "decimal(39,0)", "decimal(5,6)", "decimal(1,2,3)", "decimal()", "decimal(a)",
    "int(5)", "string(5)", "tinyint(1)", "array(3)", "character", "varchar(1,2)", "time(10)",
    "interval days", "interval month to month", "interval hour to hour",
    "interval minute to hour", "interval day to day", "interval year to day",
    "interval day to month", "string collate", "int collate utf8_lcase",
]

# Spellings Spark refuses that Theseus still reads, for plans written before it followed
# Spark's grammar
THESEUS_ONLY = [("text", "string"), ("bool", "boolean"), ("null", "void"),
                ("varchar", "string"), ("char", "string")]


@pytest.mark.parametrize("text,spark,canon", SPARK_TYPES)
def test_parse_type(text, spark, canon):
    assert T.parse_type(text) == canon


@pytest.mark.parametrize("text,spark,canon", SPARK_TYPES)
def test_the_canonical_form_parses_to_itself(text, spark, canon):
    assert T.parse_type(canon) == canon


@pytest.mark.parametrize("text,spark,canon",
                         [row for row in SPARK_TYPES if "`" not in row[0]])
def test_sparks_spelling_reads_as_the_same_type(text, spark, canon):
    # Spark writes names unquoted, so only rows with plain names read back
    assert T.parse_type(spark) == canon


# Not types, though DataType.fromDDL reads them as a column list (``a int`` -> struct<a:int>)
THESEUS_REFUSES = ["", "  ", "a int", "a int, b string"]


@pytest.mark.parametrize("bad", SPARK_REFUSES + THESEUS_REFUSES)
def test_bad_types(bad):
    with pytest.raises(T.TypeSyntaxError):
        T.parse_type(bad)


@pytest.mark.parametrize("text,canon", THESEUS_ONLY)
def test_spellings_read_before_stay_readable(text, canon):
    assert T.parse_type(text) == canon


def test_errors_say_what_was_expected():
    with pytest.raises(T.TypeSyntaxError, match="expected a field name .* found '>'"):
        T.parse_type("struct<a:int,>")
    with pytest.raises(T.TypeSyntaxError, match="precision is at most 38"):
        T.parse_type("decimal(39,0)")
    with pytest.raises(T.TypeSyntaxError,
                       match="expected minute or second after 'interval hour to'"):
        T.parse_type("interval hour to hour")
    with pytest.raises(T.TypeSyntaxError, match="type int takes no parameters"):
        T.parse_type("int(5)")


@pytest.mark.parametrize("canon,fields", [
    ("struct<a:int,`b c`:map<string,int>>", [("a", "int"), ("b c", "map<string,int>")]),
    ("struct<`a,b`:int,`x``y:<`:array<int>>", [("a,b", "int"), ("x`y:<", "array<int>")]),
    ("struct<>", []),
])
def test_struct_fields_unquote_names(canon, fields):
    assert T.struct_fields(canon) == fields


def test_quoted_field_names_compare_by_name():
    old = T.parse_type("struct<`a b`: int>")
    assert T.can_widen(old, T.parse_type("struct<`A B` bigint, c string>"))
    assert not T.can_widen(old, T.parse_type("struct<a_b: bigint>"))


@pytest.mark.parametrize("old,new,ok", [
    ("int", "bigint", True), ("bigint", "int", False), ("float", "double", True),
    ("double", "float", False), ("int", "string", False), ("int", "double", True),
    ("decimal(10,2)", "decimal(12,2)", True), ("decimal(10,2)", "decimal(10,3)", False),
    ("array<int>", "array<bigint>", True), ("struct<a:int>", "struct<a:int,b:string>", True),
    ("struct<a:int,b:string>", "struct<a:int>", False), ("date", "timestamp", True),
])
def test_can_widen(old, new, ok):
    assert T.can_widen(old, new) is ok


def test_a_sql_table_declares_spark_ddl_types():
    from compat.sql import compile_sql

    doc = compile_sql("CREATE TABLE t (s STRUCT<a INT, `B c` STRING NOT NULL COMMENT 'x'>, "
                      "d DECIMAL(5), i INTERVAL DAY TO SECOND, v VARCHAR(3)) USING kafka;\n"
                      "CREATE TABLE out USING kafka AS SELECT s.a, d, i, v FROM t;", "q.sql")
    assert {c["name"]: c["type"] for c in doc["nodes"][0]["schema"]} == {
        "s": "struct<a:int,`b c`:string>", "d": "decimal(5,0)", "i": "interval day to second",
        "v": "string"}
