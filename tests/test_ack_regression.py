"""Issue 11: an acknowledged offset never moves back.  A write that would lower one raises
OffsetRegression naming the topic, the partition and both offsets (a bug, a topic deleted and
created again, a query restarted from an older checkpoint), instead of keeping the larger."""

from __future__ import annotations

import json

import pytest

from compat.errors import OffsetRegression
from gates.state import (
    GateState,
    acked_offsets,
    drop_pending,
    is_acked,
    pending_path,
    promote_pending,
    write_ack,
    write_pending,
)

OPEN = GateState()
CAP = GateState("capped", {"t": {0: 10, 1: 7}}, epoch=3)


def test_an_ack_going_backwards_is_reported_and_not_written(tmp_path):
    write_ack(tmp_path, "q", "t", {0: 40, 1: 12}, OPEN, reader="events")
    write_ack(tmp_path, "q", "t", {0: 40, 1: 12}, OPEN, reader="events")  # same: fine
    with pytest.raises(OffsetRegression) as e:
        # the query restarted from an older checkpoint
        write_ack(tmp_path, "q", "t", {0: 41, 1: 9}, OPEN, reader="events")
    err = e.value
    assert (err.topic, err.partition) == ("t", 1)
    assert err.expected == "offset 12 or later" and err.found == "offset 9"
    assert err.file.endswith("q.ack.json") and "query 'q'" in str(err)
    assert acked_offsets(tmp_path, "q") == {"t": {0: 40, 1: 12}}


def test_two_sources_of_one_topic_are_told_apart(tmp_path):
    """A self-join reads one topic through two sources whose positions differ."""
    write_ack(tmp_path, "q", "t", {0: 40}, OPEN, reader="left")
    write_ack(tmp_path, "q", "t", {0: 35}, OPEN, reader="right")
    with pytest.raises(OffsetRegression):
        write_ack(tmp_path, "q", "t", {0: 30}, OPEN, reader="right")


def test_other_topics_and_new_partitions_are_not_regressions(tmp_path):
    write_ack(tmp_path, "q", "a", {0: 40}, OPEN)
    write_ack(tmp_path, "q", "b", {0: 1}, OPEN)
    write_ack(tmp_path, "q", "a", {0: 40, 1: 0}, OPEN)  # a partition added to the topic
    assert acked_offsets(tmp_path, "q") == {"a": {0: 40, 1: 0}, "b": {0: 1}}


def test_a_stale_pending_batch_is_dropped_before_it_can_be_promoted(tmp_path):
    """Planned up to the cap, but the query stopped before that batch ran; restarted, the
    source plans a smaller batch: what was pending must not be acknowledged."""
    write_ack(tmp_path, "q", "t", {0: 4, 1: 2}, CAP, reader="events")
    write_pending(tmp_path, "q", "t", {0: 10, 1: 7}, CAP, reader="events")
    write_pending(tmp_path, "q", "u", {0: 1}, CAP, reader="other")
    drop_pending(tmp_path, "q", "t")
    assert pending_path(tmp_path, "q").exists()  # another topic's: kept
    drop_pending(tmp_path, "q", "u")
    assert not pending_path(tmp_path, "q").exists()
    assert not promote_pending(tmp_path, "q")
    assert not is_acked(tmp_path, "q", CAP.cap)


def test_promotion_acknowledges_for_the_reader_that_planned_the_batch(tmp_path):
    write_ack(tmp_path, "q", "t", {0: 4, 1: 2}, CAP, reader="events")
    write_pending(tmp_path, "q", "t", {0: 10, 1: 7}, CAP, reader="events")
    assert promote_pending(tmp_path, "q")
    assert is_acked(tmp_path, "q", CAP.cap, epoch=3)
    with pytest.raises(OffsetRegression):  # and the same reader cannot go back after it
        write_ack(tmp_path, "q", "t", {0: 4, 1: 2}, CAP, reader="events")


def reader_name(tmp_path, nodes, **options):
    from gates.source import SourceOptions, _reader_name

    plan = tmp_path / "queries" / "q" / "plan.json"
    plan.parent.mkdir(parents=True, exist_ok=True)
    plan.write_text(json.dumps({"nodes": nodes}))
    opts = SourceOptions.parse({"bootstrap": "b:9092", "topic": "t", "schema": "id BIGINT",
                                "store": str(tmp_path), "query": "q", **options})
    return _reader_name(opts)


def test_a_source_is_named_by_its_node_or_its_topic_or_for_itself(tmp_path):
    one = [{"step": "source", "topic": "t"}, {"step": "source", "topic": "u"},
           {"step": "source", "topic": "t", "role": "table"}]
    two = [{"step": "source", "topic": "t"}, {"step": "source", "topic": "t"}]
    assert reader_name(tmp_path, two, node="left") == "left"
    # stable across restarts, so that a restart from an older checkpoint is caught
    assert reader_name(tmp_path, one) == reader_name(tmp_path, one) == "t"
    # a self-join's two sources of "t" cannot be told apart: each is named for itself
    a, b = reader_name(tmp_path, two), reader_name(tmp_path, two)
    assert a != b and a.startswith("t#") and b.startswith("t#")
