"""The contract across a topic edge: what a producer writes, what a consumer's source
declares and uses, and the ``upstream-*`` findings on the consumer."""

from __future__ import annotations

from dataclasses import replace

import pytest

from compat.fleet.contract import Contract, impacts, produced, usage
from compat.infer import INSERT, RETRACT, UPSERT, analyze
from compat.serde import from_doc
from tests.conftest import ship_load

COLS = (("ship_id", "string"), ("load", "double"), ("n", "bigint"), ("note", "string"))
PRODUCER = Contract("ship_load", "ship_load", COLS, ("ship_id",), INSERT, "json")


def _plan(nodes: list[dict], query: str = "consumer") -> object:
    nodes = [{"version": 1, **n} for n in nodes]
    plan = from_doc({"format": "theseus.plan/1", "query": query, "nodes": nodes},
                    f"{query}.json")
    analyze(plan)
    return plan


def _source(cols=COLS, role="table", keys=("ship_id",), topic="ship_load", fmt="json",
            node_id="loads", **kw) -> dict:
    d = {"id": node_id, "step": "source", "topic": topic, "partitions": 3, "format": fmt,
         "role": role, "schema": [{"name": n, "type": t} for n, t in cols], **kw}
    if keys:
        d["key_columns"] = list(keys)
    return d


def _sink(inp: str, keys=("ship_id",), mode="update", topic="out") -> dict:
    return {"id": "out", "step": "sink", "inputs": [inp], "topic": topic, "format": "json",
            "key_columns": list(keys), "mode": mode, "delivery": "exactly_once"}


def stream_consumer(cols=COLS, role="stream", keys=()) -> object:
    """Reads ship_load as a stream: filters on load, writes ship_id and load."""
    return _plan([
        # the source comes second so that its pointer is /nodes/1
        {"id": "heavy", "step": "filter", "inputs": ["loads"], "predicate": "load > 10"},
        _source(cols, role=role, keys=keys),
        {"id": "slim", "step": "project", "inputs": ["heavy"],
         "columns": [{"name": "ship_id", "expr": "ship_id"},
                     {"name": "tons", "expr": "load / 1000"}]},
        _sink("slim", keys=(), mode="append"),
    ])


def table_consumer(cols=COLS, keys=("ship_id",)) -> object:
    """Reads ship_load as a table, joined by a stream of packages on ship_id only."""
    return _plan([
        {"id": "packages", "step": "source", "topic": "packages", "partitions": 3,
         "format": "json", "role": "stream",
         "schema": [{"name": "ship_id", "type": "string"}, {"name": "w", "type": "double"}]},
        _source(cols, role="table", keys=keys),
        {"id": "j", "step": "join", "inputs": ["packages", "loads"], "type": "inner",
         "left_keys": ["ship_id"], "right_keys": ["ship_id"]},
        {"id": "p", "step": "project", "inputs": ["j"],
         "columns": [{"name": "ship_id", "expr": "ship_id"}, {"name": "w", "expr": "w"}]},
        _sink("p", keys=(), mode="append"),
    ])


def aggregate_consumer(cols=COLS) -> object:
    """Reads ship_load as a stream and sums n per ship: n only as an aggregate argument."""
    return _plan([
        _source(cols, role="stream", keys=()),
        {"id": "agg", "step": "aggregate", "inputs": ["loads"],
         "group_by": [{"name": "ship_id", "expr": "ship_id"}],
         "aggregates": [{"name": "total", "function": "sum", "args": ["n"]}]},
        _sink("agg"),
    ])


def codes(findings) -> dict[str, str]:
    return {f.code: f.effect for f in findings}


def one(findings, code):
    got = [f for f in findings if f.code == code]
    assert len(got) == 1, findings
    return got[0]


# -- the two sides ----------------------------------------------------------------------------


def test_produced_reads_the_sink():
    plan = from_doc(ship_load(), "ship_load.json")
    analyze(plan)
    c = produced(plan)
    assert c == Contract("ship_load", "ship_alerts", (("ship_id", "string"),
                                                      ("load", "double"),
                                                      ("capacity", "double")),
                         ("ship_id",), RETRACT, "json")


def test_usage_follows_filters_projections_and_the_sink():
    u = usage(stream_consumer(), "loads")
    assert u.used == {"ship_id", "load"}  # n and note are declared, never read
    assert u.inserts_only and u.role == "stream"
    assert set(u.read_by("load")) == {"heavy", "out"}


def test_usage_through_a_join_key_only():
    u = usage(table_consumer(), "loads")
    # ship_id is the join key (and the table's key); load, n, note are never read
    assert u.used == {"ship_id"}
    assert not u.inserts_only


def test_usage_through_an_aggregate_argument_only():
    u = usage(aggregate_consumer(), "loads")
    assert u.used == {"ship_id", "n"}
    assert u.read_by("n") == ("agg",)


def test_usage_event_time_and_windows():
    cols = (("ship_id", "string"), ("ts", "timestamp"), ("note", "string"))
    plan = _plan([
        _source(cols, role="stream", keys=(), event_time={"column": "ts",
                                                           "watermark": "1 minute"}),
        {"id": "agg", "step": "aggregate", "inputs": ["loads"], "group_by": [],
         "aggregates": [{"name": "c", "function": "count", "args": ["1"]}],
         "window": {"type": "tumbling", "column": "ts", "size": "1 minute"}},
        _sink("agg", keys=(), mode="append"),
    ])
    assert usage(plan, "loads").used == {"ts"}


def test_usage_of_a_self_join_reads_both_sides_and_the_condition():
    cols = (("a", "string"), ("b", "bigint"), ("c", "string"), ("ts", "timestamp"))
    plan = _plan([
        _source(cols, role="stream", keys=(), node_id="l",
                event_time={"column": "ts", "watermark": "1 minute"}),
        _source(cols, role="stream", keys=(), node_id="r",
                event_time={"column": "ts", "watermark": "1 minute"}),
        {"id": "j", "step": "join", "inputs": ["l", "r"], "type": "inner",
         "left_keys": ["a"], "right_keys": ["a"], "condition": "r.b > l.b"},
        {"id": "p", "step": "project", "inputs": ["j"],
         "columns": [{"name": "x", "expr": "r_c"}]},
        _sink("p", keys=(), mode="append"),
    ])
    assert usage(plan, "l").used == {"a", "b", "ts"}
    assert usage(plan, "r").used == {"a", "b", "c", "ts"}


# -- columns ------------------------------------------------------------------------------------


def test_column_removed_that_the_consumer_reads_is_unsupported():
    new = replace(PRODUCER, columns=tuple(c for c in COLS if c[0] != "load"))
    plan = stream_consumer()
    f = one(impacts(PRODUCER, new, plan, "loads"), "upstream-column-removed")
    assert f.effect == "unsupported" and f.severity == "error"
    assert f.new_node == f.old_node == "loads"
    assert f.new_pointer == "/nodes/1/schema/1"
    assert "ship_load" in f.message and "'heavy'" in f.message


def test_column_removed_that_no_one_reads_is_harmless():
    new = replace(PRODUCER, columns=tuple(c for c in COLS if c[0] != "note"))
    f = one(impacts(PRODUCER, new, stream_consumer(), "loads"), "upstream-column-removed")
    assert (f.effect, f.severity) == ("none", "info")
    assert f.new_pointer == "/nodes/1/schema/3"


def test_column_removed_read_only_as_an_aggregate_argument():
    new = replace(PRODUCER, columns=tuple(c for c in COLS if c[0] != "n"))
    f = one(impacts(PRODUCER, new, aggregate_consumer(), "loads"), "upstream-column-removed")
    assert f.effect == "unsupported" and f.new_pointer == "/nodes/0/schema/2"


def test_column_removed_read_only_as_a_join_key():
    new = replace(PRODUCER, columns=tuple(c for c in COLS if c[0] != "ship_id"),
                  key_columns=())
    found = impacts(PRODUCER, new, table_consumer(), "loads")
    assert one(found, "upstream-column-removed").effect == "unsupported"
    new = replace(PRODUCER, columns=tuple(c for c in COLS if c[0] != "load"))
    assert codes(impacts(PRODUCER, new, table_consumer(), "loads")) == \
        {"upstream-column-removed": "none"}


def test_column_renamed_in_case_is_removed_for_json_readers():
    new = replace(PRODUCER, columns=(("ship_id", "string"), ("Load", "double"),
                                     ("n", "bigint"), ("note", "string")))
    found = impacts(PRODUCER, new, stream_consumer(), "loads")
    f = one(found, "upstream-column-removed")
    assert f.effect == "unsupported" and "case-sensitive" in f.message
    assert one(found, "upstream-column-added").effect == "none"


def test_column_added_is_harmless():
    new = replace(PRODUCER, columns=COLS + (("eta", "timestamp"),))
    f = one(impacts(PRODUCER, new, stream_consumer(), "loads"), "upstream-column-added")
    assert (f.effect, f.severity) == ("none", "info")
    assert f.new_pointer == "/nodes/1/schema"
    assert "eta" in f.message


def test_type_widened_into_the_declared_type_is_harmless():
    old = replace(PRODUCER, columns=(("ship_id", "string"), ("load", "float"),
                                     ("n", "int"), ("note", "string")))
    found = impacts(old, PRODUCER, stream_consumer(), "loads")
    assert codes(found) == {"upstream-type-changed": "none"}
    assert {f.new_pointer for f in found} == {"/nodes/1/schema/1/type", "/nodes/1/schema/2/type"}


def test_type_changed_beyond_the_declared_type():
    new = replace(PRODUCER, columns=(("ship_id", "string"), ("load", "string"),
                                     ("n", "bigint"), ("note", "string")))
    f = one(impacts(PRODUCER, new, stream_consumer(), "loads"), "upstream-type-changed")
    assert f.effect == "unsupported" and f.new_pointer == "/nodes/1/schema/1/type"
    # widened past what the consumer declares (bigint -> double into bigint)
    new = replace(PRODUCER, columns=(("ship_id", "string"), ("load", "double"),
                                     ("n", "double"), ("note", "string")))
    assert codes(impacts(PRODUCER, new, aggregate_consumer(), "loads")) == \
        {"upstream-type-changed": "unsupported"}
    # the same change on a column nobody reads
    assert codes(impacts(PRODUCER, new, stream_consumer(), "loads")) == \
        {"upstream-type-changed": "none"}


def test_a_string_column_reads_anything():
    cols = (("ship_id", "string"), ("load", "string"))
    new = replace(PRODUCER, columns=(("ship_id", "string"), ("load", "decimal(10,2)")))
    old = replace(PRODUCER, columns=(("ship_id", "string"), ("load", "double")))
    plan = _plan([_source(cols, role="stream", keys=()),
                  _sink("loads", keys=(), mode="append")])
    assert codes(impacts(old, new, plan, "loads")) == {"upstream-type-changed": "none"}


# -- key, mode, format, topic, removal ------------------------------------------------------


def test_key_changed_under_a_table_consumer():
    new = replace(PRODUCER, key_columns=("ship_id", "note"))
    f = one(impacts(PRODUCER, new, table_consumer(), "loads"), "upstream-key-changed")
    assert f.effect == "unsupported" and f.new_pointer == "/nodes/1/key_columns"
    # the same columns in another order: the table still finds its key
    plan = table_consumer(keys=("ship_id", "note"))
    old = replace(PRODUCER, key_columns=("note", "ship_id"))
    f = one(impacts(old, new, plan, "loads"), "upstream-key-changed")
    assert (f.effect, f.severity) == ("none", "warning")


def test_key_changed_under_a_stream_consumer_only_repartitions():
    new = replace(PRODUCER, key_columns=("ship_id", "note"))
    f = one(impacts(PRODUCER, new, stream_consumer(), "loads"), "upstream-key-changed")
    assert (f.effect, f.severity) == ("none", "warning")
    assert f.new_pointer == "/nodes/1"


def test_mode_widened_under_a_stream_consumer():
    old = replace(PRODUCER, mode=INSERT)
    for mode in (UPSERT, RETRACT):
        f = one(impacts(old, replace(PRODUCER, mode=mode), stream_consumer(), "loads"),
                "upstream-mode-widened")
        assert f.effect == "unsupported" and f.new_pointer == "/nodes/1/role"
    f = one(impacts(replace(PRODUCER, mode=UPSERT), replace(PRODUCER, mode=RETRACT),
                    stream_consumer(), "loads"), "upstream-mode-widened")
    assert f.effect == "unsupported"


def test_mode_widened_under_a_table_consumer_is_fine():
    old = replace(PRODUCER, mode=INSERT)
    for mode in (UPSERT, RETRACT):
        f = one(impacts(old, replace(PRODUCER, mode=mode), table_consumer(), "loads"),
                "upstream-mode-widened")
        assert (f.effect, f.severity) == ("none", "info")


def test_mode_narrowed_is_fine():
    f = one(impacts(replace(PRODUCER, mode=UPSERT), PRODUCER, stream_consumer(), "loads"),
            "upstream-mode-narrowed")
    assert f.effect == "none"


def test_format_changed():
    new = replace(PRODUCER, columns=(("value", "string"),), format="string")
    found = impacts(PRODUCER, new, stream_consumer(), "loads")
    f = one(found, "upstream-format-changed")
    assert f.effect == "unsupported" and f.new_pointer == "/nodes/1/format"
    # the consumer reads the new format already: fine
    plan = _plan([_source((("value", "string"),), role="stream", keys=(), fmt="string"),
                  _sink("loads", keys=(), mode="append")])
    assert codes(impacts(PRODUCER, new, plan, "loads"))["upstream-format-changed"] == "none"


def test_topic_changed():
    new = replace(PRODUCER, topic="ship_load_v2")
    f = one(impacts(PRODUCER, new, stream_consumer(), "loads"), "upstream-topic-changed")
    assert f.effect == "unsupported" and f.new_pointer == "/nodes/1/topic"
    assert "ship_load_v2" in f.message


def test_producer_removed():
    (f,) = impacts(PRODUCER, None, stream_consumer(), "loads")
    assert f.code == "upstream-removed" and f.effect == "unsupported"
    assert "ship_load" in f.message and f.new_pointer == "/nodes/1/topic"
    assert impacts(None, None, stream_consumer(), "loads") == []


def test_no_change_no_findings():
    for plan in (stream_consumer(), table_consumer(), aggregate_consumer()):
        assert impacts(PRODUCER, PRODUCER, plan, "loads") == []
        assert impacts(None, PRODUCER, plan, "loads") == []


# -- the steady state: a consumer against a producer as it is --------------------------------


def test_column_missing_is_a_finding_not_a_crash():
    plan = stream_consumer(cols=COLS + (("eta", "timestamp"),))
    # eta is declared, unread: nothing to say
    assert impacts(None, PRODUCER, plan, "loads") == []
    new = replace(PRODUCER, columns=tuple(c for c in COLS if c[0] != "load"))
    f = one(impacts(None, new, stream_consumer(), "loads"), "upstream-column-missing")
    assert f.effect == "unsupported" and f.new_pointer == "/nodes/1/schema/1"
    # a column missing before and after is still missing
    f = one(impacts(new, new, stream_consumer(), "loads"), "upstream-column-missing")
    assert f.effect == "unsupported"


def test_schema_mismatch():
    new = replace(PRODUCER, columns=(("ship_id", "string"), ("load", "boolean")))
    f = one(impacts(None, new, stream_consumer(), "loads"), "upstream-schema-mismatch")
    assert f.effect == "unsupported" and f.new_pointer == "/nodes/1/schema/1/type"
    new = replace(PRODUCER, format="string")
    f = one(impacts(None, new, stream_consumer(), "loads"), "upstream-schema-mismatch")
    assert f.new_pointer == "/nodes/1/format"
    new = replace(PRODUCER, key_columns=("note",))
    f = one(impacts(None, new, table_consumer(), "loads"), "upstream-schema-mismatch")
    assert f.new_pointer == "/nodes/1/key_columns"


def test_mode_mismatch_in_the_steady_state_is_a_warning():
    upserts = replace(PRODUCER, mode=UPSERT)
    for old in (None, upserts):
        f = one(impacts(old, upserts, aggregate_consumer(), "loads"), "upstream-mode-mismatch")
        assert (f.effect, f.severity) == ("none", "warning")
    assert impacts(None, upserts, table_consumer(), "loads") == []


@pytest.mark.parametrize("code", [
    "upstream-column-removed", "upstream-column-added", "upstream-type-changed",
    "upstream-key-changed", "upstream-mode-widened", "upstream-mode-narrowed",
    "upstream-mode-mismatch", "upstream-format-changed", "upstream-topic-changed",
    "upstream-removed", "upstream-column-missing", "upstream-schema-mismatch"])
def test_every_code_is_registered_with_advice(code):
    from compat.findings import CODES

    effect, severity, utype, hint = CODES[code]
    assert hint and hint.endswith(".")


def test_column_renamed_says_so():
    new = replace(PRODUCER, columns=(("ship_id", "string"), ("weight", "double"),
                                     ("n", "bigint"), ("note", "string")))
    found = impacts(PRODUCER, new, stream_consumer(), "loads")
    f = one(found, "upstream-column-removed")
    assert "renamed to 'weight'?" in f.message and f.effect == "unsupported"
