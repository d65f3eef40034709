"""Findings: frozen records of what differs between two plans, with stable codes.

Every code has a default *effect* on the verdict (``none`` < ``in_place`` < ``migrate`` <
``unsupported``), a severity, an upgrade type of the ksqlDB taxonomy and a hint that says
what to do.  Rules may raise or lower the effect of one finding when they know better (a
stateless join may change freely, a stateful one may not).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

EFFECTS = ("none", "in_place", "migrate", "unsupported")
EFFECT_RANK = {e: i for i, e in enumerate(EFFECTS)}
UPGRADE_TYPES = ("transparent", "data_selection", "schema_evolution", "source_modifying",
                 "topology", "scaling")

_MIGRATE = "Deploy it with a live migration (theseus migrate start): the shadow query " \
           "rebuilds state from the retained source history."
_RESTART = "Restart the query on its checkpoint (theseus migrate start, or stop and run)."
_NEW_OUTPUT = "Write to a new output topic (a new query) and move consumers over, or keep " \
              "the old behaviour."

#: code -> (effect, severity, upgrade_type, hint)
CODES: dict[str, tuple[str, str, str, str]] = {
    # structure of the walk
    "enforcing-added": ("migrate", "error", "topology", _MIGRATE),
    "enforcing-removed": ("migrate", "error", "topology", _MIGRATE),
    "step-type-changed": ("migrate", "error", "topology", _MIGRATE),
    "frontier-changed": ("migrate", "error", "topology", _MIGRATE),
    "step-version-changed": ("in_place", "info", "transparent", _RESTART),
    # sources
    "source-added": ("migrate", "error", "source_modifying", _MIGRATE),
    "source-removed": ("migrate", "error", "source_modifying", _MIGRATE),
    "source-topic-changed": ("migrate", "error", "source_modifying", _MIGRATE),
    "source-format-changed": ("migrate", "error", "source_modifying", _MIGRATE),
    "source-role-changed": ("migrate", "error", "source_modifying", _MIGRATE),
    "source-key-changed": ("migrate", "error", "source_modifying", _MIGRATE),
    "source-column-added": ("in_place", "info", "schema_evolution", _RESTART),
    "source-column-removed": ("in_place", "warning", "schema_evolution", _RESTART),
    "source-column-type-changed": ("in_place", "warning", "schema_evolution", _RESTART),
    "source-event-time-changed": ("in_place", "warning", "data_selection",
                                  "Late rows are judged by the new watermark from the restart "
                                  "on; windows already closed stay closed."),
    "source-partitions-changed": ("in_place", "warning", "scaling",
                                  "Spark picks up added partitions on restart; make sure "
                                  "they exist before the upgrade."),
    "source-partitions-reduced": ("migrate", "error", "scaling", _MIGRATE),
    "source-starting-offsets-changed": ("none", "info", "transparent",
                                        "Starting offsets apply only to a fresh checkpoint."),
    # stateful steps
    "aggregate-key-changed": ("migrate", "error", "topology", _MIGRATE),
    "aggregate-key-type-changed": ("migrate", "error", "schema_evolution", _MIGRATE),
    "aggregate-key-renamed": ("in_place", "info", "schema_evolution", _RESTART),
    "aggregate-function-changed": ("migrate", "error", "schema_evolution", _MIGRATE),
    "aggregate-added": ("migrate", "error", "schema_evolution", _MIGRATE),
    "aggregate-removed": ("migrate", "error", "schema_evolution", _MIGRATE),
    "aggregate-renamed": ("in_place", "info", "schema_evolution", _RESTART),
    "aggregate-arg-type-changed": ("migrate", "error", "schema_evolution", _MIGRATE),
    "aggregate-arg-changed": ("in_place", "warning", "data_selection",
                              "History stays computed the old way; add --require backfill "
                              "to have it recomputed by a migration."),
    "aggregate-window-changed": ("migrate", "error", "topology", _MIGRATE),
    "join-type-changed": ("migrate", "error", "topology", _MIGRATE),
    "join-keys-changed": ("migrate", "error", "topology", _MIGRATE),
    "join-time-bound-changed": ("migrate", "error", "topology", _MIGRATE),
    "join-condition-changed": ("migrate", "error", "data_selection", _MIGRATE),
    "join-state-schema-changed": ("migrate", "error", "schema_evolution", _MIGRATE),
    "join-statefulness-changed": ("migrate", "error", "topology", _MIGRATE),
    "dedup-keys-changed": ("migrate", "error", "topology", _MIGRATE),
    "dedup-within-changed": ("in_place", "warning", "data_selection",
                             "Rows are remembered for the new duration from the restart on."),
    "dedup-within-toggled": ("migrate", "error", "topology", _MIGRATE),
    "topn-partition-changed": ("migrate", "error", "topology", _MIGRATE),
    "topn-order-changed": ("migrate", "error", "topology", _MIGRATE),
    "topn-n-increased": ("migrate", "error", "data_selection",
                         "The state only kept the old top rows; " + _MIGRATE[0].lower()
                         + _MIGRATE[1:]),
    "topn-n-decreased": ("in_place", "warning", "data_selection", _RESTART),
    "topn-state-schema-changed": ("migrate", "error", "schema_evolution", _MIGRATE),
    "recursive-body-changed": ("migrate", "error", "topology", _MIGRATE),
    "recursive-feedback-changed": ("migrate", "error", "scaling", _MIGRATE),
    # sink and output
    "sink-topic-changed": ("unsupported", "error", "topology", _NEW_OUTPUT),
    "sink-key-changed": ("unsupported", "error", "topology", _NEW_OUTPUT),
    "sink-mode-changed": ("unsupported", "error", "topology", _NEW_OUTPUT),
    "sink-format-changed": ("unsupported", "error", "schema_evolution", _NEW_OUTPUT),
    "sink-delivery-changed": ("in_place", "warning", "transparent", _RESTART),
    "output-column-added": ("in_place", "info", "schema_evolution",
                            "Consumers reading by name ignore the new column."),
    "output-column-removed": ("unsupported", "error", "schema_evolution",
                              "Keep the column, or relax --schema-compat if every consumer "
                              "can cope."),
    "output-column-renamed": ("unsupported", "error", "schema_evolution",
                              "Keep the old name (JSON is read by name), or relax "
                              "--schema-compat."),
    "output-column-widened": ("in_place", "info", "schema_evolution",
                              "Consumers must accept the wider type."),
    "output-column-type-changed": ("unsupported", "error", "schema_evolution",
                                   "Keep the old type or a wider one."),
    "changelog-mode-changed": ("unsupported", "error", "schema_evolution", _NEW_OUTPUT),
    "changelog-mode-narrowed": ("in_place", "warning", "schema_evolution",
                                "Consumers keep working: the new output uses a subset of "
                                "the change kinds they already handle."),
    # passive steps
    "passive-added": ("in_place", "info", "data_selection", _RESTART),
    "passive-removed": ("in_place", "info", "data_selection", _RESTART),
    "filter-changed": ("in_place", "info", "data_selection", _RESTART),
    "project-changed": ("in_place", "info", "schema_evolution", _RESTART),
    "explode-changed": ("in_place", "info", "data_selection", _RESTART),
    "predicate-moved": ("in_place", "info", "data_selection",
                        "Equivalent output: the predicate is on grouping keys only."),
    "nondeterminism-introduced": ("in_place", "warning", "data_selection",
                                  "A replayed batch may produce different rows."),
    # plan level
    "state-partitions-changed": ("migrate", "error", "scaling", _MIGRATE),
    "config-changed": ("in_place", "info", "transparent", _RESTART),
    "formatting-only": ("none", "info", "transparent", "Nothing to do."),
    # requirements
    "requirement-backfill": ("migrate", "error", "data_selection", _MIGRATE),
    "requirement-exactly-once": ("unsupported", "error", "transparent",
                                 "Keep delivery exactly_once, or drop the requirement."),
    "nondeterministic-backfill": ("unsupported", "error", "topology",
                                  "Make the stateful part deterministic (no rand(), uuid(), "
                                  "current_timestamp() or processing-time windows)."),
}


@dataclass(frozen=True)
class Finding:
    code: str
    effect: str
    severity: str
    upgrade_type: str
    message: str
    hint: str
    old_node: str | None = None
    new_node: str | None = None
    old_pointer: str | None = None
    new_pointer: str | None = None
    #: the change alters what enters state: history stays computed the old way
    history: bool = False

    def with_effect(self, effect: str, severity: str | None = None) -> Finding:
        return replace(self, effect=effect, severity=severity or self.severity)

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code, "severity": self.severity, "effect": self.effect,
            "upgrade_type": self.upgrade_type, "message": self.message, "hint": self.hint,
            "old": {"node": self.old_node, "pointer": self.old_pointer},
            "new": {"node": self.new_node, "pointer": self.new_pointer},
            "history": self.history,
        }


def finding(code: str, message: str, *, old: Any = None, new: Any = None,
            old_pointer: str | None = None, new_pointer: str | None = None,
            effect: str | None = None, severity: str | None = None,
            history: bool = False, hint: str | None = None) -> Finding:
    d_effect, d_sev, utype, d_hint = CODES[code]
    return Finding(code=code, effect=effect or d_effect, severity=severity or d_sev,
                   upgrade_type=utype, message=message, hint=hint or d_hint,
                   old_node=getattr(old, "id", old), new_node=getattr(new, "id", new),
                   old_pointer=old_pointer, new_pointer=new_pointer, history=history)
