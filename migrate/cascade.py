"""Cascading migrations: queries chained through topics migrated together at one logical cut.

``theseus migrate start UP.json DOWN.json``: the upstream query writes a topic that the
downstream query reads.  A cascade is one single migration per query (:mod:`migrate.protocol`,
every one on the shadow path), driven in an order that makes the whole chain switch at one
logical point:

1. Check    every query, upstream first; a refusal of any leaves every old query as it is.
2. Shadow   every new query, upstream first.  An upstream's shadow writes its output before
            its cut to ``<topic>.shadow``; a downstream's shadow reads that side topic, then
            the real topic from the propagated cut (:mod:`gates.cascade`): it computes the
            new downstream plan over the new upstream plan over all input.
3. Pause    the upstream as in a single migration; a downstream has no pause of its own: its
            shadow catches up with the side topic.
4. Cut      the upstream's control events in its source topics.
5. Align    the upstream's old query finishes the input before the cut; at once
            (``propagate``) one control event goes into every partition of its output topic:
            the downstream's cut C, the same logical point in its input (nothing else writes
            the topic until the cutover).  The downstream's old query is capped at C right
            away, so the trigger that reads the old upstream's last output usually reads the
            cap too; its shadow switches at C as soon as the upstream's shadow has finished
            the input before the cut (where its output before the cut ends in the side
            topic).  The upstream's new query holds its first output from the cut until the
            old downstream query has seen its cap, so nothing of the new upstream's output
            reaches the old downstream query.
6. Cutover  upstream first, as soon as every downstream of it adopted C (its old query
            capped there and seen to be): its new query writes the topic from the cut
            (after the control events) while the downstreams align; each downstream's new
            query writes the output from C.
7. Finish   every query records its new plan; the side topics are deleted.

The cascade's record (``<store>/migrations/<id>.cascade.json``, ``compat/schemas/cascade.v1.json``)
lists every query with its migration, phase and counts; each migration's record names the
cascade, so ``migrate status|resume|abort`` accept any query of the chain.  Every step of every
migration is recorded before it acts, so a migrator killed anywhere resumes the whole chain.
``abort`` is refused once the upstream's old query finished the input before its cut (the
same point of no return as a single migration): ``resume`` then finishes the chain.
"""

from __future__ import annotations

import graphlib
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from compat.check import load_plan
from compat.errors import InvalidRequest, MigrationError, Refused, Unsupported
from compat.model import Plan
from compat.steps import Source
from gates.deadline import Deadline
from gates.files import atomic_write
from migrate import runner
from migrate.context import Context
from migrate.lease import Lease
from migrate.phases import rollback
from migrate.phases.catch_up import catch_up
from migrate.protocol import TERMINAL, path_of
from migrate.record import Migration, NothingToResume, load_record, new_migration
from migrate.store import DirectoryStore

#: the phases of one migration of a cascade, in order (the shadow path)
ORDER = path_of("shadow")


@dataclass
class Cascade:
    id: str
    migrations: list[str]  # upstream first
    queries: list[str]
    links: list[dict[str, str]]  # {"upstream": query, "downstream": query, "topic": topic}
    phase: str = "running"  # running | done | aborted | refused
    members: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    @staticmethod
    def path(store: DirectoryStore, cascade_id: str):
        return store.root / "migrations" / f"{cascade_id}.cascade.json"

    def save(self, store: DirectoryStore, deadline: Deadline | None = None) -> None:
        self.members = [member(Migration.load(store, mid)) for mid in self.migrations]
        atomic_write(self.path(store, self.id), json.dumps(asdict(self), indent=2) + "\n")
        store.flush(deadline)

    @classmethod
    def load(cls, store: DirectoryStore, cascade_id: str) -> Cascade:
        return load_record(cls, store, cls.path(store, cascade_id), "cascade", cascade_id)


def member(m: Migration) -> dict[str, Any]:
    """One query of a cascade as its record lists it."""
    return {"query": m.query, "migration": m.id, "phase": m.phase, "kind": m.kind,
            "cut": m.cut, "out_cut": m.out_cut, "counts": m.counts}


# -- the chain --------------------------------------------------------------------------

def stream_topics(plan: Plan) -> set[str]:
    return {n.topic for n in plan.nodes.values()
            if isinstance(n, Source) and n.role == "stream"}


def reader_of(plan: Plan, topic: str) -> Source:
    """The first stream source of ``plan`` that reads ``topic``."""
    return next(n for n in plan.nodes.values() if isinstance(n, Source) and
                n.role == "stream" and n.topic == topic)


def chain(plans: dict[str, Plan], paths: dict[str, str]
          ) -> tuple[list[str], list[dict[str, str]]]:
    """The queries of a cascade upstream first, and the links between them: an upstream's
    output topic is a stream source topic of its downstream. Refused: a plan linked to no
    other, a downstream fed by two queries of the cascade or reading a stream topic no
    query of the cascade writes (its cut would not be one logical point), a cycle."""
    ts = graphlib.TopologicalSorter({q: set() for q in plans})
    links: list[dict[str, str]] = []
    by_topic: dict[str, str] = {}
    for q, p in plans.items():
        if p.sink.topic in by_topic:
            raise InvalidRequest(f"two plans of the cascade write topic '{p.sink.topic}'",
                                 file=paths[q], node=p.sink.id,
                                 expected="one writer per topic",
                                 found=f"'{by_topic[p.sink.topic]}' and '{q}'")
        by_topic[p.sink.topic] = q
    for q, p in plans.items():
        ups = sorted({by_topic[t] for t in stream_topics(p) if t in by_topic} - {q})
        for u in ups:
            ts.add(q, u)
            links.append({"upstream": u, "downstream": q, "topic": plans[u].sink.topic})
        if len(ups) > 1:
            # Each upstream propagates its own cut (its control events in its own topic, at
            # its own moment); a downstream takes one propagated cut over (one side topic to
            # backfill from, one switch, one upstream holding its output until then).
            second = reader_of(p, plans[ups[1]].sink.topic)
            raise Unsupported(
                f"query '{q}' reads the outputs of {len(ups)} queries of the cascade "
                f"({', '.join(ups)}): a downstream takes over the propagated cut of one "
                "upstream only; several upstreams, each cut at its own point, are not "
                "supported", file=paths[q], node=second.id, pointer=p.pointer(second.id),
                expected="one upstream of the cascade per downstream",
                found=", ".join(f"'{plans[u].sink.topic}' written by '{u}'" for u in ups),
                hint=f"migrate all but one of {', '.join(ups)} on their own first (an "
                f"output that only gains columns leaves '{q}' as it is: JSON is read by "
                f"name), then the last one and '{q}' as a cascade")
        if ups:
            other = sorted(stream_topics(p) - {plans[ups[0]].sink.topic})
            if other:
                node = reader_of(p, other[0])
                raise Unsupported(f"query '{q}' also reads {', '.join(other)}, which no "
                                  "query of the cascade writes: its input would not be cut "
                                  "at one logical point", file=paths[q], node=node.id,
                                  pointer=p.pointer(node.id),
                                  expected=f"only topic '{plans[ups[0]].sink.topic}'",
                                  found=", ".join(sorted(stream_topics(p))))
    linked = {x for lk in links for x in (lk["upstream"], lk["downstream"])}
    for q in plans:
        if q not in linked:
            raise InvalidRequest(f"query '{q}' neither feeds nor reads another query of the "
                                 "cascade", file=paths[q],
                                 expected="plans chained through topics (an output topic "
                                 "that another plan reads)",
                                 found=f"output '{plans[q].sink.topic}'",
                                 hint="migrate it on its own")
    try:
        order = list(ts.static_order())
    except graphlib.CycleError as e:
        raise InvalidRequest("the plans of the cascade feed each other in a cycle",
                             file=paths[next(iter(paths))], found=" -> ".join(e.args[1])) \
            from None
    return order, links


def start(store: DirectoryStore, plan_paths: list[str], *, bootstrap: str,
          cut_mode: str = "control-events", require: list[str] | None = None,
          compare: bool = False, reconcile: str = "auto", master: str = "local[2]",
          trigger: str = "1 second", echo: Callable[[str], None] = print,
          timeout: float = 600.0, live: Callable[[str, str], None] | None = None,
          lease_ttl: float | None = None) -> Cascade:
    """Migrate the queries of ``plan_paths`` (one plan each, chained through topics)
    together. Every query is migrated through a shadow query: a downstream's input changes
    even when its own plan does not.  One process owns the whole chain: it holds the
    lease of every query of it (:mod:`migrate.lease`)."""
    if cut_mode != "control-events":
        raise InvalidRequest("a cascade propagates its cut as control events",
                             expected="--cut control-events", found=f"--cut {cut_mode}")
    plans: dict[str, Plan] = {}
    paths: dict[str, str] = {}
    for path in plan_paths:
        p = load_plan(path)
        if p.query in plans:
            raise InvalidRequest(f"two plans of the cascade are query '{p.query}'", file=path,
                                 expected="one plan per query", found=paths[p.query])
        plans[p.query], paths[p.query] = p, path
    order, links = chain(plans, paths)
    for lk in links:  # the running queries are chained the same way
        up, down, topic = lk["upstream"], lk["downstream"], lk["topic"]
        old_up = load_plan(str(store.plan_path(store.live_instance(up))))
        old_down = load_plan(str(store.plan_path(store.live_instance(down))))
        if old_up.sink.topic != topic:
            raise Refused(f"query '{up}' runs a plan writing '{old_up.sink.topic}', its "
                          f"new plan writes '{topic}'", file=paths[up],
                          node=plans[up].sink.id, expected="the same output topic",
                          found=topic)
        if topic not in stream_topics(old_down):
            raise Refused(f"query '{down}' runs a plan that does not read '{topic}'",
                          file=paths[down], expected=f"a stream source of '{topic}'",
                          found=", ".join(sorted(stream_topics(old_down))) or "none")
    cid = f"c{time.strftime('%Y%m%d%H%M%S')}-{uuid.uuid4().hex[:6]}"
    lease = Lease.take(store, order, cid, what="theseus migrate start", ttl=lease_ttl)
    with lease.installed():
        return _start(store, lease, cid, order, links, paths, plans, bootstrap=bootstrap,
                      cut_mode=cut_mode, require=require, compare=compare,
                      reconcile=reconcile, master=master, trigger=trigger, echo=echo,
                      timeout=timeout, live=live)


def _start(store: DirectoryStore, lease: Lease, cid: str, order: list[str],
           links: list[dict[str, str]], paths: dict[str, str], plans: dict[str, Plan], *,
           bootstrap: str,
           cut_mode: str, require: list[str] | None, compare: bool, reconcile: str,
           master: str, trigger: str, echo: Callable[[str], None], timeout: float,
           live: Callable[[str, str], None] | None) -> Cascade:
    ms = {q: new_migration(store, q, paths[q], bootstrap=bootstrap, strategy="shadow",
                           cut_mode=cut_mode, require=require, compare=compare,
                           reconcile=reconcile, master=master, trigger=trigger,
                           plan=plans[q])
          for q in order}
    for m in ms.values():
        m.cascade = cid
    for lk in links:
        ms[lk["upstream"]].feeds.append(ms[lk["downstream"]].id)
        ms[lk["downstream"]].cut_from = ms[lk["upstream"]].id
    deadline = Deadline(timeout, hint=f"theseus migrate resume {order[0]} continues the "
                        f"cascade; theseus migrate abort {order[0]} rolls it back")
    for m in ms.values():
        m.save(store, deadline)
    c = Cascade(id=cid, migrations=[ms[q].id for q in order], queries=order, links=links)
    c.save(store, deadline)
    echo(f"[{cid}] cascade of {len(order)} queries: " + " -> ".join(order))
    return Driver(store, c, echo, deadline, live, lease).run()


class Driver:
    """Drives the migrations of a cascade through their phases in the cascade's order, over
    one context: one record in memory per migration."""

    def __init__(self, store: DirectoryStore, c: Cascade, echo: Callable[[str], None],
                 deadline: Deadline, live: Callable[[str, str], None] | None = None,
                 lease: Lease | None = None) -> None:
        self.store = store
        self.c = c
        self.echo = echo
        self.deadline = deadline
        self.ctx = Context(store, echo, deadline=deadline, live=live, lease=lease)
        self.order = [Migration.load(store, mid) for mid in c.migrations]
        # a downstream records in its upstream's migration (side_end)
        self.ctx.records.update((m.id, m) for m in self.order)

    def save(self) -> None:
        self.c.save(self.store, self.deadline)

    def advance(self, m: Migration, target: str) -> None:
        """Run ``m``'s steps until its phase is ``target`` or later (or it ended)."""
        while m.phase not in TERMINAL and ORDER.index(m.phase) < ORDER.index(target):
            runner.step(m, self.ctx)
            self.save()

    def run(self) -> Cascade:
        order = self.order
        downstream = [m for m in order if m.cut_from]
        # 1. Check every query before anything starts: a refusal leaves them all as they are.
        try:
            for m in order:
                self.advance(m, "shadow")
        except (MigrationError, Refused) as e:
            for m in order:
                if m.phase not in TERMINAL and ORDER.index(m.phase) <= ORDER.index("shadow"):
                    rollback.abort(m, self.ctx)
            self.c.phase, self.c.error = "refused", e.render()
            self.save()
            raise
        # 2. Every shadow, upstream first (a downstream's reads the upstream's side topic).
        for m in order:
            self.advance(m, "pause")
        # 3. The downstream shadows catch up with the side topics.
        for m in downstream:
            self.advance(m, "cut")
        # 3-5. Upstream first: pause, cut, align (its old query), propagate; a downstream
        # adopts the propagated cut (its old query capped there at once and seen to be, its
        # shadow switching once the upstream's shadow reached the cut) and aligns on it.
        by_id = {m.id: m for m in order}
        for m in order:
            up = by_id.get(m.cut_from or "")
            if up is not None:
                self.advance(m, "align")
                # 6. The upstream's cutover as soon as every downstream of it adopted the
                # cut: an old downstream query reads nothing past it, and a downstream's
                # shadow is capped there until its old query acknowledged it. Its new query
                # writing on while the downstreams align keeps that wait off the stall.
                if all(d.phase in TERMINAL or ORDER.index(d.phase) >= ORDER.index("align")
                       for d in order if d.cut_from == up.id):
                    self.advance(up, "finish")
            self.advance(m, "cutover")
        # 6. Cutover, upstream first: its new query writes from the cut (after the control
        # events), then each downstream's new query takes over its output.
        for m in order:
            self.advance(m, "finish")
        # 7. Finish every query (the side topics go: every downstream switched).
        for m in order:
            self.advance(m, "done")
        self.c.phase = "done" if all(m.phase == "done" for m in order) else \
            next(m.phase for m in order if m.phase != "done")
        self.save()
        self.echo(f"[{self.c.id}] cascade {self.c.phase}: " + ", ".join(
            f"{m.query} {m.phase}" for m in order))
        return self.c

    def abort(self) -> Cascade:
        """Upstream first: once the upstream's old query finished the input before its cut,
        its abort refuses, and nothing of the chain is touched."""
        for m in self.order:
            if m.phase not in TERMINAL:
                rollback.abort(m, self.ctx, drop_side=False)
            self.save()
        # the side topics go once every shadow of the chain stopped (a downstream shadow
        # reads its upstream's side topic); again on a resumed abort, harmlessly
        aborted = [m for m in self.order if m.phase == "aborted"]
        for m in aborted:
            self.ctx.processes.wait_stopped(m)
        for m in aborted:
            if m.reconciling or m.feeds:
                self.ctx.topics.delete_side_topic(m)
        self.c.phase = "aborted"
        self.save()
        return self.c


def resume(store: DirectoryStore, cascade_id: str, *, echo: Callable[[str], None] = print,
           timeout: float = 600.0, live: Callable[[str, str], None] | None = None,
           query: str | None = None, lease_ttl: float | None = None) -> Migration:
    """Continue the cascade from the recorded phases of its migrations; returns the
    migration of ``query`` (the first query of the chain by default)."""
    c = Cascade.load(store, cascade_id)
    if c.phase in ("done", "aborted", "refused"):
        raise NothingToResume.of(store, f"cascade {c.id}", c.phase, c.error)
    lease = Lease.take(store, c.queries, c.id, what="theseus migrate resume", ttl=lease_ttl)
    with lease.installed():
        c = Cascade.load(store, cascade_id)  # as its last owner left it
        if c.phase in ("done", "aborted", "refused"):
            raise NothingToResume.of(store, f"cascade {c.id}", c.phase, c.error)
        deadline = Deadline(timeout, hint=f"theseus migrate resume {c.queries[0]} "
                            "continues the cascade")
        driver = Driver(store, c, echo, deadline, live, lease)
        for m in driver.order:  # what an expiry left (migrate.phases.catch_up)
            catch_up(m, driver.ctx)
        driver.run()
    return _of(store, c, query)


def abort(store: DirectoryStore, cascade_id: str, *, echo: Callable[[str], None] = print,
          query: str | None = None) -> Migration:
    c = Cascade.load(store, cascade_id)
    for mid in c.migrations:  # before anything is taken over (upstream first)
        m = Migration.load(store, mid)
        if m.phase not in TERMINAL:
            rollback.refuse_late(m, store)
            break
    lease = Lease.take(store, c.queries, c.id, what="theseus migrate abort", preempt=True)
    with lease.installed():
        lease.await_preempted(echo)
        c = Cascade.load(store, cascade_id)  # as the process it stopped left it
        Driver(store, c, echo, Deadline(600.0), lease=lease).abort()
    return _of(store, c, query)


def _of(store: DirectoryStore, c: Cascade, query: str | None) -> Migration:
    i = c.queries.index(query) if query in c.queries else 0
    return Migration.load(store, c.migrations[i])

