"""The sink acknowledges a cap as soon as the batch reaching it commits."""

from __future__ import annotations

from gates.state import (
    GateState,
    acked_offsets,
    is_acked,
    pending_path,
    promote_pending,
    write_ack,
    write_pending,
)

CAP = GateState("capped", {"t": {0: 10, 1: 7}}, epoch=3)


def test_pending_becomes_the_ack_when_the_batch_commits(tmp_path):
    write_ack(tmp_path, "q", "t", {0: 4, 1: 2}, CAP)
    write_pending(tmp_path, "q", "t", {0: 10, 1: 7}, CAP)
    assert not is_acked(tmp_path, "q", CAP.cap)  # planned, not committed
    promote_pending(tmp_path, "q")
    assert is_acked(tmp_path, "q", CAP.cap, epoch=3)
    assert not pending_path(tmp_path, "q").exists()
    promote_pending(tmp_path, "q")  # nothing pending: nothing changes
    assert acked_offsets(tmp_path, "q") == {"t": {0: 10, 1: 7}}


def test_promotion_never_moves_an_ack_back(tmp_path):
    write_pending(tmp_path, "q", "t", {0: 10, 1: 7}, CAP)
    write_ack(tmp_path, "q", "t", {0: 12, 1: 5}, GateState())
    promote_pending(tmp_path, "q")
    assert acked_offsets(tmp_path, "q") == {"t": {0: 12, 1: 7}}


def test_pending_topics_merge(tmp_path):
    cap = GateState("capped", {"a": {0: 1}, "b": {0: 2}}, epoch=1)
    write_pending(tmp_path, "q", "a", {0: 1}, cap)
    write_pending(tmp_path, "q", "b", {0: 2}, cap)
    promote_pending(tmp_path, "q")
    assert is_acked(tmp_path, "q", cap.cap)
