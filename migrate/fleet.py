"""``theseus migrate start --fleet NEW_DIR``: migrate what changed in a fleet of queries.

The fleet under NEW_DIR (every plan in its tree, :mod:`compat.fleet.graph`) is compared
with what the store's queries run (the plan each recorded when it started, serialized):

* a query whose plan is the one it runs is left alone;
* a query of the fleet that the store does not know is not running here: it is named and
  left alone (``theseus run`` starts it);
* the changed queries are grouped by the topics between them: changed queries chained
  through topics (one writes what the other reads) are migrated together as one cascade
  (:mod:`migrate.cascade`), cut at one logical point; a changed query with no changed
  neighbour is migrated alone (:mod:`migrate.migration`).  An unchanged query reading a
  changed one's output keeps running: from the cut on it reads the new plan's output.

Groups run one after the other, upstream first; the first that fails stops the rest (its
error says how to resume it), and what was done before stays done.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compat.errors import InvalidRequest
from compat.fleet.graph import Fleet, load_fleet
from compat.serde import dumps
from migrate.store import DirectoryStore


@dataclass
class FleetChange:
    """What ``--fleet`` will do: groups of changed queries (upstream first in each, and
    the groups upstream first), and the queries it leaves alone."""

    groups: list[list[str]] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    not_running: list[str] = field(default_factory=list)

    def describe(self, root: str) -> str:
        parts = [" -> ".join(g) + (" (one cascade)" if len(g) > 1 else "")
                 for g in self.groups]
        lines = [f"fleet {root}: " + (f"{len(parts)} migration(s): " + "; ".join(parts)
                                      if parts else "nothing to migrate")]
        if self.unchanged:
            lines.append("  runs its plan already: " + ", ".join(self.unchanged))
        if self.not_running:
            lines.append("  not running here (theseus run starts it): " +
                         ", ".join(self.not_running))
        return "\n".join(lines)


def running_plan(store: DirectoryStore, query: str) -> str | None:
    """The plan ``query`` runs (serialized as ``theseus run`` records it); None when the
    store does not know the query."""
    inst = store.live_instance(query)
    if not store.status(inst):
        return None
    try:
        return store.plan_path(inst).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


def changes(store: DirectoryStore, fleet: Fleet) -> FleetChange:
    """Compare every query of ``fleet`` with what it runs; group the changed ones."""
    out = FleetChange()
    changed: list[str] = []
    for q in fleet.order():
        running = running_plan(store, q)
        if running is None:
            out.not_running.append(q)
        elif running == dumps(fleet.queries[q].plan):
            out.unchanged.append(q)
        else:
            changed.append(q)
    # connected through topics among the changed queries (union-find on the links)
    parent = {q: q for q in changed}

    def find(q: str) -> str:
        while parent[q] != q:
            parent[q] = parent[parent[q]]
            q = parent[q]
        return q

    for q in changed:
        for d in fleet.successors(q):
            if d in parent and d != q:
                parent[find(d)] = find(q)
    groups: dict[str, list[str]] = {}
    for q in changed:  # fleet order: upstream first, in every group and across groups
        groups.setdefault(find(q), []).append(q)
    out.groups = list(groups.values())
    return out


def start(store: DirectoryStore, root: str, *, strategy: str = "auto",
          echo: Callable[[str], None] = print, **options: Any) -> list[tuple[list[str], str]]:
    """Migrate every changed query of the fleet under ``root``; returns each group's
    queries and how it ended (``done``, or the phase a migration stopped in)."""
    from migrate import cascade, migration

    fleet = load_fleet(root)
    plan = changes(store, fleet)
    echo(plan.describe(root))
    if strategy == "in-place" and any(len(g) > 1 for g in plan.groups):
        g = next(g for g in plan.groups if len(g) > 1)
        raise InvalidRequest("changed queries chained through topics are migrated as one "
                             "cascade, through shadow queries", file=root,
                             expected="--strategy auto or shadow",
                             found=f"--strategy in-place for {' -> '.join(g)}")
    done: list[tuple[list[str], str]] = []
    for g in plan.groups:
        paths = [str(Path(root) / fleet.queries[q].path) for q in g]
        if len(g) == 1:
            m = migration.start(store, g[0], paths[0], strategy=strategy, echo=echo,
                                plan=fleet.queries[g[0]].plan, **options)
            done.append((g, m.phase))
        else:
            c = cascade.start(store, paths, echo=echo, **options)
            done.append((g, c.phase))
    return done
