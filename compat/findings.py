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

MIGRATE = "Deploy it with a live migration (theseus migrate start): the shadow query " \
           "rebuilds state from the retained source history."
RESTART = "Restart the query on its checkpoint (theseus migrate start, or stop and run)."
#: the advice for an in-place change of a query over tables read as changelogs, which the
#: migrator deploys through a shadow (``migrate.migration``: a restart on the checkpoint
#: would send retractions of rows written under the old plan through the new steps)
CHANGELOG_RESTART = "Deploy it with theseus migrate start, which runs the new plan as a " \
    "shadow query (fresh state, the output reconciled at the cut); do not stop the query " \
    "and run the new plan on this checkpoint: over a table read as a changelog the new " \
    "steps would see the retractions of rows written under the old ones."
NEW_OUTPUT = "Write to a new output topic (a new query) and move consumers over, or keep " \
              "the old behaviour."

#: code -> (effect, severity, upgrade_type, hint); the codes of one step type are registered
#: by its module under ``compat/steps/`` (``register_codes``), these are the cross-step ones
CODES: dict[str, tuple[str, str, str, str]] = {
    # structure of the walk
    "enforcing-added": ("migrate", "error", "topology", MIGRATE),
    "enforcing-removed": ("migrate", "error", "topology", MIGRATE),
    "step-type-changed": ("migrate", "error", "topology", MIGRATE),
    "frontier-changed": ("migrate", "error", "topology", MIGRATE),
    "step-version-changed": ("in_place", "info", "transparent", RESTART),
    "source-added": ("migrate", "error", "source_modifying", MIGRATE),
    "source-removed": ("migrate", "error", "source_modifying", MIGRATE),
    "different-query": ("unsupported", "error", "topology",
                        "Deploy the new plan as a new query with theseus run (and stop the "
                        "old one with theseus stop when nothing reads it any more)."),
    # sink output, as consumers see it
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
    "changelog-mode-changed": ("unsupported", "error", "schema_evolution", NEW_OUTPUT),
    "changelog-mode-narrowed": ("in_place", "warning", "schema_evolution",
                                "Consumers keep working: the new output uses a subset of "
                                "the change kinds they already handle."),
    # passive steps
    "passive-added": ("in_place", "info", "data_selection", RESTART),
    "passive-removed": ("in_place", "info", "data_selection", RESTART),
    "predicate-moved": ("in_place", "info", "data_selection",
                        "Equivalent output: the predicate is on grouping keys only."),
    "nondeterminism-introduced": ("in_place", "warning", "data_selection",
                                  "A replayed batch may produce different rows."),
    # plan level
    "state-partitions-changed": ("migrate", "error", "scaling", MIGRATE),
    "config-changed": ("in_place", "info", "transparent", RESTART),
    "formatting-only": ("none", "info", "transparent", "Nothing to do."),
    "changelog-restart-shadowed": ("none", "info", "transparent",
                                   "Deploy it with theseus migrate start (--strategy auto or "
                                   "shadow), not with theseus run on the old checkpoint."),
    # requirements
    "requirement-backfill": ("migrate", "error", "data_selection", MIGRATE),
    "requirement-exactly-once": ("unsupported", "error", "transparent",
                                 "Keep delivery exactly_once, or drop the requirement."),
    "nondeterministic-backfill": ("unsupported", "error", "topology",
                                  "Make the stateful part deterministic (no rand(), uuid(), "
                                  "current_timestamp() or processing-time windows)."),
}


def register_codes(codes: dict[str, tuple[str, str, str, str]]) -> None:
    """Add a step type's finding codes (code -> effect, severity, upgrade type, hint)."""
    for code, (effect, severity, utype, _hint) in codes.items():
        if code in CODES and CODES[code] != codes[code]:
            raise ValueError(f"finding code {code!r} is registered twice")
        if effect not in EFFECT_RANK or utype not in UPGRADE_TYPES or \
                severity not in ("error", "warning", "info"):
            raise ValueError(f"finding code {code!r}: bad effect, severity or upgrade type")
    CODES.update(codes)


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


#: advice for an effect, when a finding's effect is not the one its code's hint was
#: written for (a rule raised or lowered it)
EFFECT_HINTS = {"none": "Nothing to do.", "in_place": RESTART, "migrate": MIGRATE,
                "unsupported": NEW_OUTPUT}
#: added to the advice of an in-place change that leaves history computed the old way
HISTORY_NOTE = " To have history recomputed too, use --require backfill (a live migration)."
#: the severity each effect has on the gate: an error is what fails it
GATE_SEVERITY = {"unsupported": "error", "migrate": "error"}


def settle(f: Finding, *, allow_migration: bool = False) -> Finding:
    """Make a finding's severity and advice follow its effect under the flags in force.

    Its severity is ``error`` exactly when it fails the gate: ``unsupported`` always,
    ``migrate`` unless ``--allow-migration`` (then a warning); an in-place change is at
    most a warning.  A hint written for the code's default effect is replaced by the
    advice of the effect it has now (a migrate finding never says to restart on the
    checkpoint), and an in-place change upstream of state says how to recompute history.
    """
    d_effect, _sev, _utype, d_hint = CODES[f.code]
    severity = f.severity
    if f.effect in GATE_SEVERITY:
        severity = "warning" if f.effect == "migrate" and allow_migration else "error"
    elif severity == "error":
        severity = "warning"
    hint = f.hint
    if f.effect != d_effect and hint == d_hint:
        hint = EFFECT_HINTS[f.effect]
    if f.effect == "in_place" and f.history and "--require backfill" not in hint:
        hint += HISTORY_NOTE
    if (severity, hint) == (f.severity, f.hint):
        return f
    return replace(f, severity=severity, hint=hint)


def finding(code: str, message: str, *, old: Any = None, new: Any = None,
            old_pointer: str | None = None, new_pointer: str | None = None,
            effect: str | None = None, severity: str | None = None,
            history: bool = False, hint: str | None = None) -> Finding:
    d_effect, d_sev, utype, d_hint = CODES[code]
    return Finding(code=code, effect=effect or d_effect, severity=severity or d_sev,
                   upgrade_type=utype, message=message, hint=hint or d_hint,
                   old_node=getattr(old, "id", old), new_node=getattr(new, "id", new),
                   old_pointer=old_pointer, new_pointer=new_pointer, history=history)
