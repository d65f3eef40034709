"""The sink acknowledges a cap as soon as the batch reaching it commits."""

from __future__ import annotations

import pytest

from compat.errors import OffsetRegression
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


def test_promotion_behind_the_ack_is_reported_not_papered_over(tmp_path):
    # issue 11: promotion used to keep the larger offset per partition ({0: 12, 1: 7})
    write_pending(tmp_path, "q", "t", {0: 10, 1: 7}, CAP)
    write_ack(tmp_path, "q", "t", {0: 12, 1: 5}, GateState())
    with pytest.raises(OffsetRegression) as e:
        promote_pending(tmp_path, "q")
    assert (e.value.topic, e.value.partition) == ("t", 0)
    assert "12" in e.value.expected and "10" in e.value.found
    assert acked_offsets(tmp_path, "q") == {"t": {0: 12, 1: 5}}  # nothing written


def test_pending_topics_merge(tmp_path):
    cap = GateState("capped", {"a": {0: 1}, "b": {0: 2}}, epoch=1)
    write_pending(tmp_path, "q", "a", {0: 1}, cap)
    write_pending(tmp_path, "q", "b", {0: 2}, cap)
    promote_pending(tmp_path, "q")
    assert is_acked(tmp_path, "q", cap.cap)


def _arm(store, follow_cap, migration="m1"):
    """The cut of ``migration`` armed: the old query capped at it (retiring there), the
    shadow's start gate opening from it once the old query handed over."""
    from gates.startgate import write_start_gate
    from gates.state import write_gate

    write_gate(store, "old", GateState("capped", follow_cap, epoch=4, retire=migration))
    write_start_gate(store, "new", False, migration, from_offsets={"t": {0: 10}},
                     follow="old", follow_offsets=follow_cap)


def test_the_start_gate_opens_from_the_cut_once_the_old_query_hands_over(tmp_path):
    from gates.startgate import StartGate

    _arm(tmp_path, {"t": {0: 10}})
    gate = StartGate(tmp_path, "new")
    write_ack(tmp_path, "new", "t", {0: 6}, CAP)
    assert not gate.is_open(1, wait=False)  # a batch before the cut: discarded
    write_ack(tmp_path, "new", "t", {0: 10}, CAP)
    assert not gate.is_open(2, wait=False)  # from the cut, but the old query is not done
    write_ack(tmp_path, "old", "t", {0: 10}, CAP)
    assert gate.is_open(2)


def test_a_veto_before_the_hand_over_keeps_the_gate_closed(tmp_path):
    from gates.startgate import StartGate
    from gates.state import handed_over, veto

    _arm(tmp_path, {"t": {0: 10}})
    write_ack(tmp_path, "new", "t", {0: 10}, CAP)
    write_ack(tmp_path, "old", "t", {0: 8}, CAP)
    assert veto(tmp_path, "old", {"t": {0: 10}}, "m1")
    write_ack(tmp_path, "old", "t", {0: 10}, CAP)  # the old query's last batch commits
    assert not handed_over(tmp_path, "old", {"t": {0: 10}}, "m1")
    assert not StartGate(tmp_path, "new").is_open(3)  # waits for nothing: vetoed
    _arm(tmp_path, {"t": {0: 10}}, "m2")
    assert handed_over(tmp_path, "old", {"t": {0: 10}}, "m2")  # another migration


def test_too_late_to_veto_once_the_old_query_acknowledged_the_cut(tmp_path):
    from gates.state import handed_over, veto

    _arm(tmp_path, {"t": {0: 10}})
    write_ack(tmp_path, "old", "t", {0: 10}, CAP)
    assert not veto(tmp_path, "old", {"t": {0: 10}}, "m1")
    assert handed_over(tmp_path, "old", {"t": {0: 10}}, "m1")


def test_an_old_query_past_the_cut_or_not_capped_by_it_never_hands_over(tmp_path):
    """Issue 32: a query whose pause was lifted (its migrator's lease went stale) may read
    past C before the cap that retires it is written. It wrote output from C on: the shadow
    must never take over there, and abort may still veto."""
    from gates.startgate import StartGate
    from gates.state import handed_over, overran, veto, write_gate

    cut = {"t": {0: 10}}
    # exactly at C, but under the pause's leased cap at H: nothing retires it at C
    write_gate(tmp_path, "old", GateState("capped", {"t": {0: 10}}, epoch=3, lease="q"))
    write_ack(tmp_path, "old", "t", {0: 10}, GateState("capped", cut, epoch=3, lease="q"))
    write_ack(tmp_path, "new", "t", {0: 10}, CAP)
    from gates.startgate import write_start_gate

    write_start_gate(tmp_path, "new", False, "m1", from_offsets=cut, follow="old",
                     follow_offsets=cut)
    assert not handed_over(tmp_path, "old", cut, "m1")
    assert not StartGate(tmp_path, "new").is_open(2, wait=False)
    # read past C (lifted), then capped at C by the cut
    write_ack(tmp_path, "old", "t", {0: 13}, GateState())
    write_gate(tmp_path, "old", GateState("capped", cut, epoch=5, retire="m1"))
    assert overran(tmp_path, "old", cut) == {"t": {0: 13}}
    assert not handed_over(tmp_path, "old", cut, "m1")
    assert not StartGate(tmp_path, "new").is_open(2, wait=False)
    assert veto(tmp_path, "old", cut, "m1")  # abort is not too late


@pytest.mark.parametrize("marks", [True, False], ids=["control-events", "offsets"])
def test_an_old_query_that_read_only_the_control_event_at_the_cut_hands_over(tmp_path,
                                                                             marks):
    """A cascade's downstream, its pause lifted while its migrator was dead, reads its input
    topic to the end: the upstream's old query retired at its cut and its new one holds its
    output, so the last record there is the propagated control event at C, which the gated
    source skips. It acknowledged C + 1 having read no row past the cut: it hands over at a
    cut made of control events (``marks``), never at one taken at H (C + 1 is a row there);
    C + 2 is a row past the cut either way (seen stalled in test_cascade's SIGKILL test)."""
    from gates.state import handed_over, overran, read_gate, retired, write_gate

    cut = {"t": {0: 10, 1: 7}}
    write_gate(tmp_path, "old", GateState("capped", cut, epoch=5, retire="m1", marks=marks))
    assert read_gate(tmp_path, "old").marks is marks  # kept through the file
    write_ack(tmp_path, "old", "t", {0: 11, 1: 8}, GateState())
    assert handed_over(tmp_path, "old", cut, "m1") is marks
    assert retired(tmp_path, "old") is marks
    assert (overran(tmp_path, "old", cut, marks=marks) == {}) is marks
    write_ack(tmp_path, "old", "t", {0: 12, 1: 8}, GateState())
    assert not handed_over(tmp_path, "old", cut, "m1")
    assert overran(tmp_path, "old", cut, marks=marks) == {"t": {0: 12, **({} if marks else
                                                                         {1: 8})}}


def test_the_old_query_retires_once_it_acknowledged_the_cut_of_its_migration(tmp_path):
    from gates.state import read_gate, retired, write_gate

    cut = GateState("capped", {"t": {0: 10, 1: 7}}, epoch=4, retire="m1")
    write_gate(tmp_path, "old", cut)
    assert read_gate(tmp_path, "old") == cut  # the field survives the file
    write_ack(tmp_path, "old", "t", {0: 10, 1: 6}, cut)
    assert not retired(tmp_path, "old")  # one partition short of the cut
    write_ack(tmp_path, "old", "t", {0: 10, 1: 7}, cut)
    assert retired(tmp_path, "old")
    write_gate(tmp_path, "old", GateState("capped", cut.cap, epoch=5))  # the pause's cap
    assert not retired(tmp_path, "old")  # a cap without a migration retires nothing
    write_gate(tmp_path, "old", GateState("open", {}, epoch=6, retire="m1"))
    assert not retired(tmp_path, "old")  # abort reopened it


def test_a_vetoed_migration_does_not_retire_the_old_query(tmp_path):
    from gates.state import retired, veto, write_gate

    cut = GateState("capped", {"t": {0: 10}}, epoch=4, retire="m1")
    write_gate(tmp_path, "old", cut)
    assert veto(tmp_path, "old", cut.cap, "m1")  # abort came first
    write_ack(tmp_path, "old", "t", {0: 10}, cut)  # then its last batch committed
    assert not retired(tmp_path, "old")
