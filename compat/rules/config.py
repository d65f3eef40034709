"""Plan-level settings: ``state_partitions`` is fixed forever by a checkpoint."""

from __future__ import annotations

from compat.findings import Finding, finding
from compat.rules import RuleContext


def check_config(ctx: RuleContext) -> list[Finding]:
    out: list[Finding] = []
    old, new = ctx.old, ctx.new
    a, b = old.state_partitions, new.state_partitions
    if a != b:
        stateful = any(i.stateful for i in new.info.values())
        msg = f"config.state_partitions changes from {a or 'default'} to {b or 'default'}"
        if stateful:
            msg += "; the checkpoint fixes the number of state partitions forever"
        out.append(finding("state-partitions-changed", msg, old_pointer=
                           "/config/state_partitions", new_pointer="/config/state_partitions",
                           effect=None if stateful else "in_place",
                           severity=None if stateful else "info"))
    rest_a = {k: v for k, v in old.config.items() if k != "state_partitions"}
    rest_b = {k: v for k, v in new.config.items() if k != "state_partitions"}
    if rest_a != rest_b:
        keys = sorted(k for k in set(rest_a) | set(rest_b) if rest_a.get(k) != rest_b.get(k))
        out.append(finding("config-changed", f"config keys changed: {', '.join(keys)}",
                           old_pointer="/config", new_pointer="/config"))
    return out
