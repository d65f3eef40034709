"""Part of step 3: the delete guard.  A reconciling migration whose reconciliation would
delete more than ``max_delete_ratio`` of the output's keys (``--max-delete-ratio``, default
10%) stops before the cut unless ``--allow-deletes``: nothing is cut or written, the old
query reads on, and the refusal (:class:`~compat.errors.Refused`, exit 6) gives the counts.
A plan that reads the wrong (empty) topic, filters out most keys or regroups them by
mistake would otherwise tombstone the output at the hand-over.

**Where the counts can be known.**  The reconciliation itself is computed by the shadow's
sink in the transaction of its first batch from the cut C (:mod:`gates.reconcile`): too late
to refuse anything, the control events are in the source topics and the old query has
retired.  Before the cut, the migrator counts it exactly *for a cut at H*: at the end of
step 3 both queries have acknowledged the high watermarks H (everything before H committed,
sink included), so the output holds the old plan over all input before H and the side topic
``<output>.shadow`` the new plan over the same input; their difference, counted by the same
:class:`gates.reconcile.Comparison` the sink corrects from, is what a cut at H would
correct, add and delete.  Both topics are read ahead while the shadow keeps pace near the
head (step 3's wait), so the count at H reads only the tails while both queries are paused.

**An estimate of the cut at C, and how it errs.**  C lies after H by the input written
between the pause and the control events (the migrator reads the tails and writes the cut
in between: about a second of input).  What that input does to the counts is not known
before C; it can add a deletion only where it creates a key that the old plan writes and the
new plan does not, and the mistakes this guard is for (a wrong topic, filter or key) are
already whole at H.  Where the guard can choose, it errs towards refusing:

* the share is of the output's *live* keys at H (a tombstoned key is not one; input before
  C can only add keys to the old plan's output, which would lower the share);
* a key counts as deleted whatever makes the new plan lack it: never produced, or
  retracted (a tombstone in the side topic);
* ``--max-delete-ratio 0`` refuses any deletion, and a count that cannot be made (a topic
  that cannot be read in time) stops the migration before the cut (a failed step 3, 5,
  resumable), never cuts without it.

A cascade's downstream reconciles without this guard: its cut is its upstream's, propagated
before its shadow can be compared with its output.
"""

from __future__ import annotations

from typing import Any

from compat.errors import Refused
from gates.reconcile import COUNTS, Comparison
from migrate import sides
from migrate.context import Context
from migrate.phases import rollback
from migrate.record import Migration, user_plan


def comparison(m: Migration, ctx: Context) -> Comparison:
    """The views of the output and of the shadow's side topic, as the sink compares them."""
    side_from = {int(p): int(o) for p, o in m.side_from.items()}
    return Comparison(m.bootstrap, sides.compare_topic(m), side_from, sides.output_topic(m),
                      ctx.deadline.timeout("the output and the side topic to be read",
                                           cap=120.0))


def count(views: Comparison) -> dict[str, int]:
    """Read the views on (the tails after the first time) and count as the sink would."""
    diff = views.refresh()
    counts = {k: int(diff.counts[k]) for k in COUNTS}
    counts["keys"] = views.output_keys()
    return counts


def verdict(counts: dict[str, int], max_ratio: float, allow: bool) -> dict[str, Any]:
    """The guard's verdict on ``counts``: the share of the output's live keys deleted, and
    whether it refuses (more than ``max_ratio`` of them, without ``allow``)."""
    keys, deleted = counts["keys"], counts["deleted"]
    ratio = deleted / keys if keys else 0.0
    return {**counts, "ratio": round(ratio, 4), "max_ratio": max_ratio,
            "allow_deletes": allow, "refuses": (not allow) and deleted > max_ratio * keys}


def summary(g: dict[str, Any]) -> str:
    """``30 of the output's 30 keys (100%) deleted: 0 corrected, 0 added, 30 deleted, 0
    already right``."""
    return (f"{g['deleted']} of the output's {g['keys']} keys ({g['ratio']:.0%}) deleted: "
            f"{g['corrected']} corrected, {g['added']} added, {g['deleted']} deleted, "
            f"{g['matched']} already right")


def refusal(m: Migration, g: dict[str, Any], what: str) -> Refused:
    """The delete guard's refusal of ``m``, in one line with the counts."""
    return Refused(
        f"{what} would delete more than --max-delete-ratio {g['max_ratio']:.0%} of the "
        f"output's keys: {summary(g)}", file=user_plan(m),
        expected=f"at most {g['max_ratio']:.0%} of the keys deleted, or --allow-deletes",
        found=f"{g['ratio']:.0%}",
        hint=f"nothing was cut or written and the old query runs on; if the deletions are "
             f"meant, theseus migrate start {user_plan(m)} --allow-deletes")


class DeleteGuard:
    """Step 3's guard over one migration: :meth:`read_ahead` while the shadow keeps pace
    near the head, :meth:`judge` once both queries acknowledged H."""

    def __init__(self, m: Migration, ctx: Context) -> None:
        self.m = m
        self.ctx = ctx
        self.views: Comparison | None = None

    def read_ahead(self) -> None:
        """Read both topics and compare every key now, off the pause: the count at H then
        reads the tails.  A read that fails here is read again at H (where it counts)."""
        if not self.m.reconciling or self.views is not None:
            return
        views = comparison(self.m, self.ctx)
        try:
            views.refresh()
        except Exception:  # read-ahead only: judge() reads for itself
            return
        self.views = views

    def judge(self, high: dict[str, dict[str, int]]) -> None:
        """Both queries stand at H: count the reconciliation of a cut there, record it,
        and refuse (rolling back the pause) when it deletes too much."""
        m, ctx = self.m, self.ctx
        if not m.reconciling:
            return
        views = self.views or comparison(m, ctx)
        g = verdict(count(views), m.max_delete_ratio, m.allow_deletes)
        m.guard = {**g, "at": high}
        ctx.save(m)
        if not g["refuses"]:
            allowed = " (--allow-deletes)" if g["deleted"] and m.allow_deletes else ""
            ctx.echo(f"  the reconciliation at the cut: {summary(g)}{allowed}")
            return
        err = refusal(m, g, "the reconciliation at the cut")
        m.error = err.render()
        ctx.echo(f"  refused before the cut: {summary(g)}")
        # lift both caps, stop the shadow, drop its side topic: as if it never started
        rollback.abort(m, ctx, outcome="refused")
        raise err
