"""The upgrade check: two plans in, a verdict with findings out.

Steps, in this fixed order:
1. load and validate both plans (schema, graph, semantics, changelog modes);
2. walk them in lockstep from the sink, applying ``RULES`` to every pair of enforcing steps
   and the passive rule on the paths between;
3. compare what consumers of the output notice (schema, changelog mode) and plan config;
4. apply the environment's requirements (``--require``);
5. the verdict is the strongest effect of any finding;
6. each finding's severity and advice follow its effect under the flags (``settle``).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field, replace
from typing import Any

from compat.errors import CheckError
from compat.findings import CHANGELOG_RESTART, EFFECT_RANK, RESTART, Finding, finding, settle
from compat.infer import analyze, characteristics
from compat.loaders import job_loader
from compat.model import ENFORCING, STEPS, Plan
from compat.rules import RuleContext, compare
from compat.rules.common import check_version
from compat.rules.config import check_config
from compat.rules.moves import find_moves
from compat.rules.output import check_changelog, check_output_schema
from compat.serde import load
from compat.steps import Source
from compat.walk import Walk

#: the rules applied to a pair of enforcing steps, in this order: the step version, the
#: step type's own rule (``compare``), and at the sink what consumers of the output notice
RULES = {name: [check_version, compare] + ([check_output_schema, check_changelog]
                                            if name == "sink" else [])
         for name, cls in STEPS.items() if cls.klass == ENFORCING}

#: the same rules without what readers of the output notice (its schema and changelog
#: mode): for an output whose readers are checked one by one (``theseus fleet check``)
RULES_NO_OUTPUT = {name: [r for r in rules if r not in (check_output_schema, check_changelog)]
                   for name, rules in RULES.items()}

REQUIREMENTS = ("backfill", "cascading", "exactly_once", "live", "ordered")
SCHEMA_COMPAT = ("forward", "backward", "full", "none")
VERDICT_EXIT = {"identical": 0, "in_place": 0, "migrate": 1, "unsupported": 3}


@dataclass
class Report:
    verdict: str
    findings: list[Finding]
    old: Plan
    new: Plan
    alignment: list[tuple[str, str, str]]
    require: list[str]
    schema_compat: str
    requirements: list[dict[str, Any]] = field(default_factory=list)
    #: passive steps paired by the walk (old id, new id, step): only when asked for
    #: (``check_plans(..., pair_passive=True)``, as ``plan diff`` does)
    passive_alignment: list[tuple[str, str, str]] = field(default_factory=list)
    #: ``--allow-migration``: the migrate verdict passes the gate (exit 0)
    allow_migration: bool = False
    #: ``--checkpoint`` / ``--query``: what the checkpoint holds and what a restart on it
    #: does (``migrate.ckcheck``); None for a check of two plans
    checkpoint: dict[str, Any] | None = None
    #: the old side's characteristics when it is a checkpoint alone (no old plan)
    old_characteristics: list[str] | None = None
    #: the old side is the checkpoint alone: ``old`` is then the new plan, for positions
    old_is_checkpoint: bool = False

    @property
    def exit_code(self) -> int:
        if self.allow_migration and self.verdict == "migrate":
            return 0
        return VERDICT_EXIT[self.verdict]

    @property
    def upgrade_types(self) -> list[str]:
        return sorted({f.upgrade_type for f in self.findings if f.effect != "none"})

    @property
    def old_chars(self) -> list[str]:
        if self.old_characteristics is not None:
            return self.old_characteristics
        return characteristics(self.old)

    def to_json(self) -> dict[str, Any]:
        old: dict[str, Any] = {"file": self.old.file, "query": self.old.query}
        if self.checkpoint is not None:
            old["checkpoint"] = self.checkpoint["path"]
            if self.old_is_checkpoint:
                old["file"] = None
        doc = {
            "format": "theseus.report/1",
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "old": old,
            "new": {"file": self.new.file, "query": self.new.query},
            "findings": [self._finding_json(f) for f in self.findings],
            "upgrade_types": self.upgrade_types,
            "characteristics": {"old": self.old_chars,
                                "new": characteristics(self.new)},
            "requirements": self.requirements,
            "schema_compat": self.schema_compat,
            "allow_migration": self.allow_migration,
            "alignment": [{"old": a, "new": b, "step": s} for a, b, s in self.alignment],
        }
        if self.checkpoint is not None:
            doc["checkpoint"] = self.checkpoint
        return doc


    def _finding_json(self, f: Finding) -> dict[str, Any]:
        doc = f.to_json()
        # A SQL plan's and a job's findings say where they were written (their pointers
        # are into the compiled or imported JSON, which nobody wrote).
        for side, plan in (("old", self.old), ("new", self.new)):
            loc = doc[side]
            if plan.positions and (loc["node"] or loc["pointer"] is not None):
                pos = plan.position(loc["pointer"], loc["node"])
                if pos is not None:
                    if pos.file:
                        loc["file"] = pos.file
                    loc["line"], loc["column"] = pos.line, pos.col
        return doc


def parse_require(text: str | None) -> list[str]:
    if not text:
        return []
    items = [x.strip().lower().replace("-", "_") for x in text.split(",") if x.strip()]
    bad = [x for x in items if x not in REQUIREMENTS]
    if bad:
        raise CheckError(f"unknown requirement '{bad[0]}' in --require",
                         expected="a comma-separated subset of " + ", ".join(REQUIREMENTS),
                         found=repr(text))
    return sorted(set(items))


def is_sql(path: str) -> bool:
    """A ``.sql`` file is a Spark SQL script, compiled into a plan when it is loaded."""
    return path.lower().endswith(".sql")


def is_job(path: str) -> bool:
    """A ``.py`` file (``FILE.py[:FUNCTION]``) is a PySpark job, imported into a plan when
    it is loaded (``theseus plan import``)."""
    head, sep, fn = path.rpartition(":")
    return path.lower().endswith(".py") or bool(sep and head.lower().endswith(".py")
                                                 and fn.isidentifier())


def load_plan(path: str, reuse: Plan | None = None, raw: bytes | None = None) -> Plan:
    """Load and validate a plan, from JSON or from a SQL script (``.sql``, compiled on the
    fly); ``reuse`` shares the identical nodes of a JSON plan loaded before (the old side of
    a check), which then need no second validation.  ``raw`` gives the file's bytes when
    they do not come from disk (a file at a git ref)."""
    if is_job(path):
        # read by running the job under Spark: migrate registers the reader
        return job_loader(path)(path, raw)
    if is_sql(path):
        # sqlglot is imported only for SQL: a check of JSON plans does not pay for it.
        from compat.sql.load import load_sql_plan

        return load_sql_plan(path, raw)
    plan = load(path, reuse, raw)
    analyze(plan, reuse)
    return plan


def check_files(old_path: str, new_path: str, *, require: list[str] | None = None,
                schema_compat: str = "forward", allow_migration: bool = False,
                pair_passive: bool = False, registry: Any = None) -> Report:
    # A check builds many small objects and frees nothing until it ends: the cyclic
    # garbage collector would only rescan them, over and over (it doubles the cost).
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        old = load_plan(old_path)
        new = load_plan(new_path, reuse=old)
        return check_plans(old, new, require=require, schema_compat=schema_compat,
                           allow_migration=allow_migration, pair_passive=pair_passive,
                           registry=registry)
    finally:
        if was_enabled:
            gc.enable()


def check_plans(old: Plan, new: Plan, *, require: list[str] | None = None,
                schema_compat: str = "forward", allow_migration: bool = False,
                pair_passive: bool = False, output_rules: bool = True,
                registry: Any = None) -> Report:
    """The check of ``new`` against ``old``; ``pair_passive`` also records which passive
    steps the walk paired (``Report.passive_alignment``), for ``plan diff``.  Without
    ``output_rules`` the output's schema and changelog mode are not judged here (not even
    under ``--require cascading``): ``theseus fleet check`` judges them against each query
    that reads the output instead.  ``registry`` (a ``compat.registry.RegistryClient``)
    also asks the schema registry whether an Avro output's subject accepts the new
    schema."""
    require = sorted(set(require or []))
    if schema_compat not in SCHEMA_COMPAT:
        raise CheckError("unknown --schema-compat", expected=" | ".join(SCHEMA_COMPAT),
                         found=repr(schema_compat))
    if not old.info:
        analyze(old)
    if not new.info:
        analyze(new)
    unrelated = _unrelated(old, new)
    if unrelated is not None:
        # Nothing to walk: pairing steps by position would only guess renames.
        return Report("unsupported", [settle(unrelated)], old, new, [], require,
                      schema_compat, allow_migration=allow_migration)
    ctx = RuleContext(old, new, frozenset(require), schema_compat)
    ctx.notes["stateful_plan"] = any(i.stateful for i in new.info.values())
    # the output's consumers are judged here (a fleet's readers are judged by the fleet)
    ctx.notes["output_rules"] = output_rules
    # Step 2: the lockstep walk.
    walk = Walk(old, new, ctx, RULES if output_rules else RULES_NO_OUTPUT,
                passive=[] if pair_passive else None)
    walk.run()
    findings = find_moves(list(walk.findings), ctx, walk.alignment)
    # Step 3: plan-level settings.
    findings.extend(check_config(ctx))
    if old.query != new.query:
        findings.append(finding("config-changed", f"the query name changes from "
                                f"'{old.query}' to '{new.query}'", old_pointer="/query",
                                new_pointer="/query"))
    if registry is not None:
        from compat.rules.avro import ask_registry

        findings.extend(ask_registry(ctx, registry))
    # Step 4: requirements of the environment.
    findings, requirements = _apply_requirements(findings, old, new, set(require))
    findings = dedupe(findings)
    verdict = verdict_of(findings)
    # Step 6: severity and advice follow each finding's effect under the flags.
    findings = [settle(f, allow_migration=allow_migration) for f in findings]
    if old.info[old.sink_id].changelog:
        findings = _changelog_advice(findings, old, new, verdict)
    return Report(verdict, findings, old, new, walk.alignment, require, schema_compat,
                  requirements, list(dict.fromkeys(walk.passive or ())), allow_migration)


def _changelog_advice(findings: list[Finding], old: Plan, new: Plan,
                      verdict: str) -> list[Finding]:
    """Over tables read as changelogs an in-place change keeps the state's layout (the
    verdict stays ``in_place``, as ksqlDB's for its TableFilter and TableSelect), but the
    migrator deploys it through a shadow and refuses a restart on the checkpoint
    (``migrate.migration``): say so, instead of advising a restart."""
    out = [replace(f, hint=CHANGELOG_RESTART) if f.effect == "in_place" and
           f.hint.startswith(RESTART) else f for f in findings]
    if verdict == "in_place":
        out.append(finding(
            "changelog-restart-shadowed", f"the output of sink '{old.sink_id}' is fed by a "
            "table read as a changelog: theseus migrate start deploys this in-place change "
            "through a shadow query (and refuses --strategy in-place); stopping the query "
            "and running the new plan on the old checkpoint would retract rows the new plan "
            "never wrote and keep rows it would not write", old=old.sink_id, new=new.sink_id,
            old_pointer=old.pointer(old.sink_id), new_pointer=new.pointer(new.sink_id)))
    return out


def source_topics(plan: Plan) -> list[str]:
    """The topics a plan reads, in plan order, each once."""
    return list(dict.fromkeys(n.topic for n in plan.nodes.values() if isinstance(n, Source)))


def _unrelated(old: Plan, new: Plan) -> Finding | None:
    """One finding when two plans share nothing: no source topic and not the output topic.

    Such a pair is two queries, not an upgrade of one: the new one is deployed beside the
    old (``theseus run``), never live-migrated onto an output it does not write."""
    o_topics, n_topics = source_topics(old), source_topics(new)
    if set(o_topics) & set(n_topics) or old.sink.topic == new.sink.topic:
        return None
    return finding(
        "different-query", f"the plans share nothing: the old query reads "
        f"{', '.join(map(repr, o_topics))} and writes '{old.sink.topic}', the new one reads "
        f"{', '.join(map(repr, n_topics))} and writes '{new.sink.topic}': they are "
        "different queries, not an upgrade of one", old=old.sink_id, new=new.sink_id,
        old_pointer=old.pointer(old.sink_id, "topic"),
        new_pointer=new.pointer(new.sink_id, "topic"))


def _apply_requirements(findings: list[Finding], old: Plan, new: Plan,
                        require: set[str]) -> tuple[list[Finding], list[dict[str, Any]]]:
    out = list(findings)
    status: list[dict[str, Any]] = []
    if "backfill" in require:
        upgraded = []
        for i, f in enumerate(out):
            if f.history and EFFECT_RANK[f.effect] < EFFECT_RANK["migrate"]:
                out[i] = Finding(**{**f.__dict__, "effect": "migrate", "severity": "error",
                                    "message": f.message + " (--require backfill: the "
                                    "output must be as if the new query had always run)",
                                    "hint": "Deploy it with a live migration: the shadow "
                                    "query recomputes history from the source topics."})
                upgraded.append(f.code)
        status.append({"name": "backfill", "met": True,
                       "note": ("history is recomputed by a migration for: " +
                                ", ".join(sorted(set(upgraded)))) if upgraded else
                       "no change alters history"})
        needs_migration = any(EFFECT_RANK[f.effect] >= EFFECT_RANK["migrate"] for f in out)
        infos = new.info.values()
        nondet = not all(i.deterministic for i in infos)
        stateful = any(i.stateful for i in infos)
        if needs_migration and nondet and stateful:
            out.append(finding("nondeterministic-backfill", "the new query is stateful and "
                               "nondeterministic: replaying history cannot reproduce what it "
                               "would have computed", new_pointer="/nodes",
                               old_pointer="/nodes"))
            status[-1]["met"] = False
    if "exactly_once" in require:
        ok = new.sink.delivery == "exactly_once"
        if not ok:
            out.append(finding("requirement-exactly-once", f"the new sink '{new.sink_id}' "
                               f"delivers {new.sink.delivery}, but --require exactly_once",
                               old=old.sink_id, new=new.sink_id,
                               old_pointer=old.pointer(old.sink_id, "delivery"),
                               new_pointer=new.pointer(new.sink_id, "delivery")))
        status.append({"name": "exactly_once", "met": ok,
                       "note": f"new sink delivers {new.sink.delivery}"})
    if "cascading" in require:
        bad = [f.code for f in out if f.code.startswith(("sink-", "changelog-", "output-"))
               and f.effect == "unsupported"]
        status.append({"name": "cascading", "met": not bad,
                       "note": "output key, mode and schema stay compatible" if not bad else
                       "breaks: " + ", ".join(sorted(set(bad)))})
    if "ordered" in require:
        status.append({"name": "ordered", "met": True, "note": "the cut is one offset vector "
                       "written as control events into every source partition"})
    if "live" in require:
        status.append({"name": "live", "met": True, "note": "a shadow migration keeps the "
                       "old query running until the cut; in-place restarts stall for one "
                       "restart"})
    return out, status


def dedupe(findings: list[Finding]) -> list[Finding]:
    seen = set()
    out = []
    for f in findings:
        key = (f.code, f.message, f.old_pointer, f.new_pointer)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


def verdict_of(findings: list[Finding]) -> str:
    """The verdict the worst effect among ``findings`` gives."""
    worst = max((EFFECT_RANK[f.effect] for f in findings), default=0)
    return {0: "identical", 1: "in_place", 2: "migrate", 3: "unsupported"}[worst]


__all__ = ["Report", "check_files", "check_plans", "check_version", "is_job", "is_sql",
           "load_plan",
           "parse_require"]
