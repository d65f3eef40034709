"""Step 1 (every path). Check the upgrade; refuse what cannot be done live, and decide the
path: an in-place restart on the checkpoint, or a shadow migration (and whether the shadow
reconciles the output at the cut).

Every refusal is recorded (phase ``refused``, with why) before it is raised, names the plan
file the user gave (never the store's copy), and says by its class what a script may do:
:class:`~compat.errors.Unsupported` (3: cannot be done live),
:class:`~compat.errors.InvalidRequest` (2: the flags contradict the upgrade),
:class:`~compat.errors.Refused` (6: the state found, the cluster's, the checkpoint's or the
store's, forbids it now).  The preflight (:func:`preflight`) comes first, before anything
is written: a source topic of the new plan that does not exist is refused, an empty one
warned about."""

from __future__ import annotations

import os

from compat.check import check_plans
from compat.checkpoint import CheckpointError
from compat.errors import BrokerError, InvalidRequest, Refused, Unsupported
from compat.model import Plan
from compat.steps import Recursive, Source
from compat.steps.source import SNAPSHOT, table_read
from gates.broker import check_access
from migrate import ckcheck, plantopics, sides
from migrate.context import Context
from migrate.phases import preview
from migrate.record import Migration, user_plan
from migrate.run import plan_access


def check(m: Migration, ctx: Context) -> None:
    old, new = sides.plans(ctx.store, m)
    report = check_plans(old, new, require=m.require)
    m.verdict = report.verdict
    if report.verdict == "unsupported":
        refuse(m, ctx, "; ".join(f"[{f.code}] {f.message}" for f in report.findings
                                 if f.effect == "unsupported"))
        raise Unsupported("the checker says this upgrade is unsupported: " + m.error,
                          file=user_plan(m), hint="see theseus check for every finding")
    have = preflight(m, ctx, new)
    if m.strategy == "in-place" and report.verdict == "migrate":
        refuse(m, ctx, "--strategy in-place, but the state is incompatible")
        raise InvalidRequest("--strategy in-place, but the state is incompatible",
                             file=user_plan(m), expected="in_place or identical",
                             found=report.verdict)
    shadow = m.strategy == "shadow" or (m.strategy == "auto" and report.verdict == "migrate")
    if not shadow and m.reconcile == "on":
        if m.strategy == "in-place":
            refuse(m, ctx, "--reconcile on needs a shadow; --strategy in-place has none")
            raise InvalidRequest("--reconcile on needs a shadow that recomputes every key "
                                 "over the history; an in-place restart cannot",
                                 file=user_plan(m), expected="--strategy auto or shadow",
                                 found="--strategy in-place")
        shadow = True  # only a shadow knows the new plan's value for every key
    agrees = checkpoint_agrees(m, ctx) if not shadow else True
    if agrees is None:
        # Nothing says what Spark would do on the checkpoint: auto never restarts into
        # a failure, so it migrates through a shadow (a fresh checkpoint); in-place,
        # asked for explicitly, restarts with a warning.
        if m.strategy == "in-place":
            ctx.echo(f"theseus: warning: the checkpoint was not verified "
                     f"({m.checkpoint.removeprefix('not verified: ')}): "
                     "restarting in place on the plan check alone, as "
                     "--strategy in-place asks")
        else:
            ctx.echo(f"theseus: the checkpoint cannot be verified from this host "
                     f"({m.checkpoint.removeprefix('not verified: ')}): migrating "
                     "through a shadow query instead of restarting in place on the "
                     "plan check alone (run the migration on the query's host to "
                     "restart in place)")
            shadow = True
    if not shadow and agrees is False:
        # The checkpoint contradicts the plan check: an in-place restart would fail or
        # run on wrong state.  auto falls back to a shadow (a fresh checkpoint).
        if m.strategy == "in-place":
            refuse(m, ctx, m.checkpoint)
            raise Refused("--strategy in-place, but the checkpoint contradicts "
                          "the plan check: " + m.checkpoint, file=user_plan(m),
                                 hint="use --strategy auto or shadow (a live migration "
                                      "on a fresh checkpoint)")
        ctx.echo(f"theseus: the checkpoint contradicts the plan check "
                 f"({m.checkpoint}): migrating through a shadow query instead")
        shadow = True
    if not shadow and report.verdict == "in_place" and old.info[old.sink.id].changelog:
        # Over a changelog, a restart on the checkpoint sends the retractions of rows
        # written under the old plan through the new steps: a stricter filter drops the
        # retraction of a row it would not have kept, so the old row stays in the output
        # for good, and a changed step upstream of a table aggregate or join subtracts
        # what was never added.  Only a fresh state (a shadow) and the reconciliation at
        # the cut give the new plan's rows; --strategy in-place is refused rather than
        # restarted into a wrong output.
        if m.strategy == "in-place":
            refuse(m, ctx, "the query reads tables as changelogs: a restart on the "
                           "checkpoint would retract rows the new plan never wrote, and "
                           "keep rows it would not write")
            raise InvalidRequest("--strategy in-place, but " + m.error,
                                 file=user_plan(m), expected="--strategy auto or shadow",
                                 found="--strategy in-place",
                                 hint="a shadow starts on a fresh state and reconciles "
                                      "the output's keys at the cut")
        ctx.echo("theseus: the query reads tables as changelogs: a restart on the "
                 "checkpoint would retract rows the new plan never wrote; migrating "
                 "through a shadow query (fresh state, reconciled at the cut) instead")
        shadow = True
    m.kind = "shadow" if shadow else "in_place"
    if shadow:
        refuse_recursion(m, ctx, old, new)
    require_access(m, ctx, old, new, shadow)
    if shadow:
        m.reconciling = decide_reconcile(m, ctx, new, old)
        require_history(m, ctx, new)
    if m.dry_run:
        m.preview.update(preview.planned(m, old, new, have))


def refuse(m: Migration, ctx: Context, why: str) -> None:
    """Record the migration as refused, and why, before the refusal is raised."""
    m.phase = "refused"
    m.error = why
    ctx.save(m)


def preflight(m: Migration, ctx: Context, new: Plan) -> dict[str, int]:
    """Before anything is written (a shadow, a gate, a control event: step 2 on): every
    source topic of the new plan must exist (a missing one is refused, naming it, its node
    and the user's plan file: a wrong name would otherwise get control events, and a
    producer's auto-creation, at the cut), and an empty one gets a one-line warning (a plan
    reading the wrong topic recomputes nothing; the delete guard of step 3 stops it from
    deleting the output).  Returns the cluster's topics and partition counts."""
    have = ctx.topics.present(m.bootstrap)
    refusal = plantopics.missing_source(new, have, user_plan(m), m.bootstrap)
    if refusal is not None:
        refuse(m, ctx, refusal.render())
        raise refusal
    topics = sorted({n.topic for n in plantopics.sources(new)})
    low = ctx.topics.low_watermarks(m.bootstrap, topics)
    high = ctx.topics.high_watermarks(m.bootstrap, topics)
    for n in plantopics.empty_sources(new, low, high):
        line = plantopics.empty_warning(n, user_plan(m))
        ctx.echo(line)
        if m.dry_run:
            m.preview.setdefault("warnings", []).append(line)
    return have


def recursion_problem(plan: Plan) -> tuple[str, str, str] | None:
    """Why a live migration cannot cut a plan with recursion (node, JSON pointer, reason),
    None when it can: the plan has at most one recursive step, and its output query (the
    steps after the recursion and the sink) reads no stream but the loop's internal topic.
    The cut of the output query is then the control events written into that topic once
    the loop finished the input before C (step 5); a second loop, or a stream the output
    query reads directly, would need a cut of its own that this protocol does not make."""
    recs = sorted(nid for nid, n in plan.nodes.items() if isinstance(n, Recursive))
    if len(recs) > 1:
        return (recs[1], plan.pointer(recs[1]),
                f"{len(recs)} recursive steps ({', '.join(recs)}): each loop's internal "
                "topic would need its own cut, and one loop may read another's; one "
                "recursive step per plan migrates live")
    if not recs:
        return None
    seen: set[str] = set()
    todo = [plan.sink_id]
    while todo:
        nid = todo.pop()
        if nid in seen:
            continue
        seen.add(nid)
        node = plan.nodes[nid]
        if isinstance(node, Recursive):
            continue  # the output query reads its internal topic, not its inputs
        if isinstance(node, Source) and table_read(node) != SNAPSHOT:
            return (nid, plan.pointer(nid),
                    f"the steps after recursive step '{recs[0]}' also read the stream "
                    f"source '{nid}' directly: the output query would need a cut in "
                    f"'{node.topic}' besides the one in the loop's internal topic")
        todo.extend(node.inputs)
    return None


def refuse_recursion(m: Migration, ctx: Context, old: Plan, new: Plan) -> None:
    """A shadow migration where a plan has a recursive step: refuse, with the reason, what
    the cut through a loop's internal topic (step 5) does not cover."""
    for label, plan, path in (("old", old, str(ctx.store.plan_path(m.old_instance))),
                              ("new", new, user_plan(m))):
        problem = recursion_problem(plan)
        if problem is not None:
            node, pointer, reason = problem
            refuse(m, ctx, f"the {label} plan: {reason}")
            raise Unsupported("a live migration of this recursive query is not "
                              f"supported: {reason}", file=path, node=node,
                              pointer=pointer, expected="one recursive step whose "
                              "loop is the only stream the output query reads",
                              found=reason, hint="run the new plan as a new query on "
                              "a new output topic")
    if not sides.has_recursion(old) and not sides.has_recursion(new):
        return
    expected = "a single query with one recursive step"
    if m.cascade or m.feeds or m.cut_from:  # cannot be cut at all (3)
        why = ("a cascade with a recursive query: the cut would have to pass through the "
               "loop's internal topic and the queries' shared topic in one chain")
        refuse(m, ctx, why)
        raise Unsupported(f"refused: {why}", file=user_plan(m), expected=expected, found=why)
    if sides.has_recursion(old) and not ctx.store.status(m.old_instance).get("loops"):
        # a state that a restart of the old query changes (6)
        why = (f"the old query '{m.old_instance}' was started by a theseus that "
               "does not record its loop query's gate: restart it with theseus run "
               "(its checkpoint keeps its place), then migrate")
        refuse(m, ctx, why)
        raise Refused(f"refused: {why}", file=user_plan(m), expected=expected, found=why)


def checkpoint_agrees(m: Migration, ctx: Context) -> bool | None:
    """Before an in-place restart: check the new plan against the running query's
    checkpoint (``theseus check --query``): False when Spark would refuse to restart on it
    or would restart on wrong state; None when it cannot be read from this host (on
    another host, a non-local URI such as ``s3a://``, none recorded), so nothing says what
    Spark would do; ``m.checkpoint`` says why."""
    st = ctx.store.status(m.old_instance)
    ck, why = ckcheck.local_checkpoint(st)
    if ck is None:
        m.checkpoint = f"not verified: {why}"
        return None
    if not os.path.isdir(ck):
        # on the query's own host, never written: a restart starts afresh
        m.checkpoint = f"not verified: no checkpoint directory yet ({ck})"
        return True
    try:
        report = ckcheck.check_checkpoint(None, m.new_plan, query=m.query,
                                          state=ctx.store.spec, require=m.require)
    except CheckpointError as e:
        if "no committed batch" in e.message:
            m.checkpoint = "not verified: " + e.render()
            return True  # nothing committed: a restart starts afresh anyway
        m.checkpoint = "unreadable checkpoint: " + e.render()
        return False
    restart = report.checkpoint["restart"] if report.checkpoint else None
    if restart is None:
        return True
    m.checkpoint = f"{restart['outcome']}" + \
        (f" ({restart['error_class']})" if restart["error_class"] else "") + \
        f": {restart['reason']}"
    return restart["outcome"] == "starts"


def decide_reconcile(m: Migration, ctx: Context, new: Plan, old: Plan | None = None) -> bool:
    """``--reconcile``: ``auto`` is on for a keyed ``update`` sink and off otherwise;
    ``on`` refuses an output it cannot reconcile, with the reason."""
    asked = m.reconcile
    if asked == "off":
        return False
    sink = new.sink
    why = None
    if m.feeds:
        why = ("the output feeds the downstream queries of the cascade, whose new queries "
               "read the new plan's output over all input: a correction would reach them "
               "twice")
    elif sides.has_recursion(new) or (old is not None and sides.has_recursion(old)):
        why = ("a plan with a recursive step: the corrections at the cut are not built "
               "for an output query behind a loop (keys without input after the cut keep "
               "the old plan's value)")
    elif sink.mode == "complete":
        why = ("a complete sink rewrites its whole result at every batch; a key it drops "
               "is never deleted, and a correction is not a row of it")
    elif not sink.key_columns:
        why = "the sink has no key columns: a compacted view has no keys to correct"
    else:
        # a snapshot-read table is read whole at every batch whatever its offsets; a
        # table read as a changelog is read from its starting offsets, like a stream
        late = sorted(n.id for n in new.nodes.values() if isinstance(n, Source)
                      and table_read(n) != SNAPSHOT and n.starting_offsets != "earliest")
        if late:
            why = (f"source(s) {', '.join(late)} start at the latest offsets: the shadow "
                   "would not see every key, and would tombstone keys it never saw")
    if why is not None:
        if asked == "on":
            refuse(m, ctx, f"--reconcile on: {why}")
            raise InvalidRequest(f"cannot reconcile the output: {why}",
                                 file=user_plan(m), node=sink.id,
                                 expected="a keyed update or append sink fed from the "
                                 "earliest offsets", found=f"mode {sink.mode}, key "
                                 f"{list(sink.key_columns)}", hint="--reconcile off "
                                 "leaves keys without input after the cut as they are")
        ctx.echo(f"  no reconciliation: {why}")
        return False
    if asked == "auto" and sink.mode != "update":
        return False
    ctx.echo(f"  reconciliation at the cut: on ({asked})")
    return True


def require_access(m: Migration, ctx: Context, old: Plan, new: Plan, shadow: bool) -> None:
    """Refuse, before the shadow starts or a control event is written, when the user
    (``--kafka-config``) may not do what the migration needs on some topic."""
    needs = plan_access(new)
    if shadow and m.cut_mode == "control-events":
        needs += [(t, "WRITE", "receives the migration's control events (the cut)")
                  for t in sorted(set(sides.source_topics(old)) |
                                  set(sides.source_topics(new)))]
    try:
        check_access(m.bootstrap, needs, ctx.deadline)
    except BrokerError as e:
        refuse(m, ctx, e.render())
        raise Refused(f"refused: {e.render()}", file=user_plan(m)) from None


def require_history(m: Migration, ctx: Context, new: Plan) -> None:
    """A stateful shadow recomputes its state from the earliest offsets, and a
    reconciling one must see every key: refuse when retention already deleted part of
    that history."""
    if not m.reconciling and not any(i.stateful for i in new.info.values()):
        return  # a plan without state needs no history
    low = ctx.topics.low_watermarks(m.bootstrap, sides.source_topics(new))
    lost = {t: ps for t, ps in low.items() if any(o > 0 for o in ps.values())}
    if lost:
        shown = "; ".join(f"{t}: " + ", ".join(f"partition {p} from offset {o}"
                                                for p, o in ps.items())
                          for t, ps in lost.items())
        refuse(m, ctx, f"history deleted by retention (earliest available: {shown})")
        raise Refused("the new plan is stateful and needs the source history "
                      "from offset 0, but retention deleted part of it",
                      file=user_plan(m), expected="earliest offsets 0",
                             found=f"earliest available offsets: {shown}")
