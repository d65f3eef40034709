"""Gate arming: the caps a migration writes for the queries' stop gates (each write a new
epoch, recorded in the migration before the gate is written), and what the queries
acknowledged under them.  The queries read their gates from the store at every trigger."""

from __future__ import annotations

from compat.errors import GateStateError
from gates.deadline import Deadline
from gates.startgate import StartGate, write_start_gate
from gates.state import GateState, acked_offsets, read_ack, write_gate
from migrate import sides
from migrate.lease import Lease
from migrate.record import Migration
from migrate.store import DirectoryStore


class GateArming:
    def __init__(self, store: DirectoryStore, deadline: Deadline,
                 lease: Lease | None = None) -> None:
        self.store = store
        self.deadline = deadline
        self.lease = lease
        #: the gates this run wrote that hold only while its lease does (gates.lease)
        self.leased: set[str] = set()

    def set(self, m: Migration, instance: str, mode: str,
            cap: dict[str, dict[int, int]] | None = None, follow: str | None = None,
            retire: str | None = None, leased: bool = False, marks: bool = False) -> int:
        """Write ``instance``'s gate under the next epoch of ``m``, recorded first.
        ``leased``: it holds only while the lease of ``m``'s query does (a pause: lifting it
        is always safe, see :mod:`gates.lease`); while such a gate is in force a lapse of
        the lease is not acted on (:attr:`migrate.lease.Lease.critical`). ``marks``: the
        cap is the migration's control events (:attr:`gates.state.GateState.marks`)."""
        m.epoch += 1
        m.save(self.store, self.deadline)
        owner = self.lease.epochs.get(m.query, 0) if self.lease is not None else 0
        write_gate(self.store.root, instance, GateState(
            mode, cap or {}, m.epoch, follow, retire, lease=m.query if leased else None,
            owner=owner, marks=marks))
        (self.leased.add if leased else self.leased.discard)(instance)
        if self.lease is not None:
            self.lease.critical = bool(self.leased)
        self.store.flush(self.deadline)
        return m.epoch

    def arm(self, m: Migration, cut: dict[str, dict[int, int]], old_too: bool = True) -> None:
        """Cap both queries at C. The shadow's cap follows the old query: its source passes C
        by itself once the old query acknowledged C, and its start gate opens for the batches
        that start at C or later, so the switch does not wait for this process. The old
        query's cap retires it: once it acknowledged C its sink writes nothing more and its
        host stops it, so it neither repeats the new query's output nor takes its CPU."""
        per = sides.instance_topics(self.store, m)
        old, inst = m.old_instance, m.new_instance
        mine = {t: cut[t] for t in per[inst]}
        theirs = {t: cut[t] for t in per[old]}
        write_start_gate(self.store.root, inst, False, m.id, from_offsets=mine,
                         follow=old, follow_offsets=theirs, reconcile=sides.reconcile_spec(m),
                         hold=bool(m.feeds))
        self.store.flush(self.deadline)
        # The shadow's cap first: were this process to die between the two, the old query,
        # still under its leased pause, reads on once the lease is stale and is never handed
        # over (its gate is not the cut that retires it), while the shadow holds its output.
        # The other way round, the shadow would read on past C with no batch starting at C.
        self.set(m, inst, "capped", mine, follow=old)
        if old_too:
            # C is the migration's control events (or, in a cascade's downstream, the ones
            # the upstream propagated), unless the cut was taken at H without them
            self.set(m, old, "capped", theirs, retire=m.id,
                     marks=bool(m.cut_from) or m.cut_mode != "offsets")

    def arm_loops(self, m: Migration, cut: dict[str, dict[int, int]]) -> None:
        """Step 4 with a recursive step: cap what reads the source topics at C (the loop
        query, or the query itself on a side without recursion). The output queries are
        cut in step 5, once the loops have finished the input before C; until then the
        shadow's start gate stays closed."""
        for gate, ts in sides.instance_topics(self.store, m).items():
            self.set(m, gate, "capped", {t: cut[t] for t in ts})

    def acked(self, instance: str) -> dict[str, dict[int, int]]:
        """What ``instance``'s sources acknowledged (nothing when unreadable)."""
        try:
            return acked_offsets(self.store.root, instance)
        except GateStateError:
            return {}

    def switched(self, instance: str) -> bool:
        """The shadow's start gate is open (it writes the output from the cut on)."""
        return StartGate(self.store.root, instance).is_open(-1, wait=False)

    def past(self, instance: str, cut: dict[str, dict[int, int]]) -> bool:
        """True once ``instance`` acknowledged input beyond ``cut`` in some partition."""
        try:
            ack = read_ack(self.store.root, instance)["topics"]
        except Exception:
            return False
        for t, parts in cut.items():
            done = ack.get(t, {}).get("offsets", {})
            if any(int(done.get(str(p), 0)) > o for p, o in parts.items()):
                return True
        return False
