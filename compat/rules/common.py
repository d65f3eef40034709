"""Rules every step pair goes through: step type and step version."""

from __future__ import annotations

from compat.findings import Finding
from compat.model import ENFORCING, Node
from compat.rules import RuleContext


def check_version(old: Node, new: Node, ctx: RuleContext) -> list[Finding]:
    if old.step != new.step or old.version == new.version:
        return []
    if new.klass == ENFORCING and ctx.new.info[new.id].stateful:
        # A new version of a stateful step computes or stores differently: state may not load.
        return [ctx.f("step-version-changed",
                      f"{new.step} '{new.id}' moves from version {old.version} to "
                      f"{new.version}; its state layout may differ", old, new, "version",
                      effect="migrate", severity="warning")]
    return [ctx.f("step-version-changed",
                  f"{new.step} '{new.id}' moves from version {old.version} to {new.version}",
                  old, new, "version")]
