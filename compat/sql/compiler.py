"""Spark SQL in, a validated ``theseus.plan/1`` document out.

Steps, in this fixed order:
1. parse the script with sqlglot (Spark dialect) and read its statements;
2. translate the query into a graph of plan steps, resolving every column;
3. add the sink, with its defaults (key: the GROUP BY columns; mode: decided in step 6);
   a windowed output gets a version 2 sink, whose key holds the window (step 6);
4. optimize: the rules of ``compat.sql.optimizer.RULES``, in order, minus excluded ones;
5. write the plan document (stable ids, inputs first, SQL text and compiler in metadata);
6. validate it as a hand-written plan is validated (schema, graph, semantics, changelog
   modes).  Without a ``mode`` option the sink appends when the plan is valid in append mode
   (insert-only output) and writes updates otherwise.  A plan the checker refuses is reported
   at the SQL that produced the offending step.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from sqlglot import exp

from compat import serde
from compat import types as T
from compat.errors import PlanError, SqlError
from compat.infer import analyze
from compat.model import NamedExpr, Plan
from compat.sql import ir
from compat.sql.optimizer import RULES, optimize
from compat.sql.parse import parse_script
from compat.sql.script import Script, SinkOptions, read_script, sink_options
from compat.sql.text import SqlText, did_you_mean
from compat.sql.translate import Output, plan_error, translate
from compat.steps import Aggregate, Join, Project, Sink, Source
from compat.steps import aggregate as _aggregate
from compat.steps import join as _join
from compat.steps import source as _source
from compat.steps.sink import WINDOWED_KEY_VERSION, window_bounds

COMPILER_VERSION = "theseus-sql/1"
#: sqlglot reads about 300 KB of SQL a second and keeps ~300 bytes per character while it
#: does: a bound keeps a stray file (a log, a dump) from taking minutes and gigabytes
MAX_SCRIPT_CHARS = 1_000_000


@dataclass
class Compiled:
    """A compiled script: the plan document, the validated plan, the final graph and the
    script it was read from (its settings and tables, with where each was written)."""

    document: dict[str, Any]
    plan: Plan
    graph: ir.Graph
    script: Script | None = None


def compile_sql(text: str, file: str = "<sql>") -> dict[str, Any]:
    """Compile a Spark SQL script into a validated plan document."""
    return compile_script(text, file).document


def compile_script(text: str, file: str = "<sql>", *,
                   rules: tuple[str, ...] | None = None) -> Compiled:
    """Compile, keeping the intermediate results; ``rules`` overrides the optimizer's."""
    if len(text) > MAX_SCRIPT_CHARS:
        raise SqlError("the script is too large to compile", file=file,
                       expected=f"at most {MAX_SCRIPT_CHARS:,} characters (a script holds "
                                "its tables and one query)", found=f"{len(text):,}")
    src = SqlText(text, file)
    try:
        # Step 1.
        script = read_script(src, parse_script(src))
        # Steps 2 and 3.
        graph, out, opts = build_graph(src, script)
        # Step 4.
        names = rules if rules is not None else _rules(src, script)
        graph = optimize(graph, names)
        # Steps 5 and 6.
        plan, graph = _validated(src, script, graph, out, opts)
    except RecursionError:
        # sqlglot and the translation recurse per level of nesting; Python's recursion
        # limit stops them long before Spark's parser would (it reads about 300 levels).
        raise _too_deep(src) from None
    return Compiled(serde.to_doc(plan), plan, graph, script)


_QUOTED = re.compile(r"""'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|`[^`]*`|--[^\n]*|/\*.*?\*/""",
                     re.DOTALL)


def _too_deep(src: SqlText) -> SqlError:
    """The query nests too deeply to compile: point at its deepest parenthesis."""
    text = _QUOTED.sub(lambda m: " " * len(m.group()), src.text)
    depth = deepest = at = 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
            if depth > deepest:
                deepest, at = depth, i
        elif ch == ")":
            depth -= 1
    message = (f"the query nests {deepest} levels of parentheses, too deep to compile"
               if deepest else "the query is nested too deeply to compile")
    return src.error(message, (at, at + 1) if deepest else None,
                     expected="fewer levels of nesting (split the query with views)",
                     found=f"{deepest} levels" if deepest else "deep nesting")


def _table_key(graph: ir.Graph, top: str) -> tuple[str, ...]:
    """The output key of a query over tables read as changelogs: the first key that is
    unique per output row (``NodeInfo.keys``), as in ksqlDB the key of the table the
    query leads to (a foreign-key join's left table; the many side of a one-to-many join);
    else none (an explode or a union: step 6 then says why no key fits)."""
    try:
        info = graph.inference.info(graph.steps, top)
    except PlanError:
        return ()  # step 6 reports it where it was written
    if not info.changelog:
        return ()
    outputs = {c.lower(): c for c in graph.columns(top)}
    for key in info.keys:
        if key and all(k in outputs for k in key):
            return tuple(outputs[k] for k in key)
    return ()


def build_graph(src: SqlText, script: Script) -> tuple[ir.Graph, Output, SinkOptions]:
    """The unoptimized graph of a script, sink included."""
    graph, out = translate(src, script)
    target = script.target
    assert target is not None
    opts = sink_options(src, target)
    top = out.rel.id
    if target.columns is not None:
        top = _rename_to_table(src, script, graph, top)
    keys = opts.key_columns if opts.key_columns is not None else \
        tuple(out.group_keys or ()) or _table_key(graph, top)
    # without a mode option, step 6 decides it: append if the plan is valid so, else update
    sink = Sink(id=target.name, inputs=(top,), topic=opts.topic, format=opts.format,
                key_columns=keys, mode=opts.mode or "append", delivery=opts.delivery,
                avro=opts.avro)
    graph.add(sink, target.span)
    graph.sink = sink.id
    if opts.key_columns is not None:
        outputs = graph.columns(top)
        low = {c.lower() for c in outputs}
        for k in opts.key_columns:
            if k.lower() not in low:
                raise src.error(f"key column '{k}' is not an output column of the query" +
                                did_you_mean(k, outputs), target.options["key"].span)
    return graph, out, opts


def _rename_to_table(src: SqlText, script: Script, graph: ir.Graph, top: str) -> str:
    """INSERT INTO a declared table: columns go by position (as in Spark), renamed."""
    target = script.target
    assert target is not None and target.columns is not None
    names = graph.columns(top)
    if len(names) != len(target.columns):
        raise src.error(f"the query gives {len(names)} columns but table '{target.name}' has "
                        f"{len(target.columns)} (INSERT INTO matches columns by position)",
                        script.query_span)
    if names == [c.name for c in target.columns]:
        return top
    pid = _fresh(graph, script, "select")
    graph.add(Project(id=pid, inputs=(top,), columns=tuple(
        NamedExpr(c.name, ir.sql(ir.col(n))) for c, n in zip(target.columns, names))),
        script.query_span)
    return pid


def _fresh(graph: ir.Graph, script: Script, prefix: str) -> str:
    n = 1
    while f"{prefix}_{n}" in graph.steps or f"{prefix}_{n}" in script.tables:
        n += 1
    return f"{prefix}_{n}"


def _rules(src: SqlText, script: Script) -> tuple[str, ...]:
    names = tuple(name for name, _fn in RULES)
    setting = script.setting("theseus.optimizer.excluded_rules")
    if setting is None:
        return names
    excluded = [x.strip() for x in str(setting.value).split(",") if x.strip()]
    for x in excluded:
        if x not in names:
            raise src.error(f"unknown optimizer rule '{x}'" + did_you_mean(x, names) +
                            "; rules: " + ", ".join(names), setting.span)
    return tuple(n for n in names if n not in excluded)


# -- writing and validating -------------------------------------------------------------------


def _document(script: Script, graph: ir.Graph) -> dict[str, Any]:
    settings = script.settings
    target = script.target
    assert target is not None
    query = settings["theseus.query"].value if "theseus.query" in settings else target.name
    config: dict[str, Any] = {}
    if "spark.sql.shuffle.partitions" in settings:
        config["state_partitions"] = settings["spark.sql.shuffle.partitions"].value
    for k, v in settings.items():
        if k.startswith("theseus.config."):
            config[k[len("theseus.config."):]] = v.value
    metadata: dict[str, Any] = {"compiler": COMPILER_VERSION, "sql": script.src.text}
    for k, v in settings.items():
        if k.startswith("theseus.metadata."):
            metadata[k[len("theseus.metadata."):]] = v.value
    doc: dict[str, Any] = {"format": serde.FORMAT, "query": str(query)}
    if config:
        doc["config"] = config
    doc["metadata"] = metadata
    doc["nodes"] = [serde.node_doc(graph.steps[sid]) for sid in graph.order()]
    return doc


def _check(src: SqlText, script: Script, graph: ir.Graph) -> Plan:
    """Validate the written plan exactly as ``compat.check.load_plan`` validates a file."""
    plan = serde.from_doc(_document(script, graph), src.file)
    analyze(plan)
    return plan


def _validated(src: SqlText, script: Script, graph: ir.Graph, out: Output,
               opts: SinkOptions) -> tuple[Plan, ir.Graph]:
    """The validated plan and its final graph (sink mode decided, output types cast)."""
    sink = graph[graph.sink]
    assert isinstance(sink, Sink)
    modes = [opts.mode] if opts.mode else ["append", "update"]
    failure: PlanError | None = None
    for mode in modes:
        g = graph.copy()
        g.put(dataclasses.replace(sink, mode=mode))
        try:
            plan = _check(src, script, g)
        except PlanError as e:
            failure = e
            continue
        if mode != "append" and opts.key_columns is None and out.missing_keys:
            raise src.error(
                f"the output is a table of updates keyed by its GROUP BY columns, but "
                f"{', '.join(repr(k) for k in out.missing_keys)} is not in the SELECT list: "
                f"select it, or set OPTIONS (key '...') on table '{sink.id}'",
                script.query_span)
        cast = _casts(script, g, plan)
        if cast is not None:
            g = cast
            try:
                plan = _check(src, script, g)
            except PlanError as e:
                raise plan_error(src, script, g, e) from None
        tables = _table_versions(g, plan)
        if tables is not None:
            g = tables
            plan = _check(src, script, g)
        if window_bounds(plan.info[g.sink]):
            # Keyed by its group columns alone, a compacted topic would keep only the last
            # window of each group: version 2 keys a windowed output by its window too
            # (the window, or the bounds of it the select carries, under any name).
            g.put(dataclasses.replace(g[g.sink], version=WINDOWED_KEY_VERSION))
            plan = _check(src, script, g)
        return plan, g
    assert failure is not None
    raise plan_error(src, script, graph, failure)


def _table_versions(g: ir.Graph, plan: Plan) -> ir.Graph | None:
    """Tables read as changelogs on the fastest step versions of this release: the
    normalisation's state per bucket of table keys (source 4), the row-based aggregate over
    a changelog (aggregate 2), a table-table join's state per bucket of join keys (join 3);
    each with its plan format's defaults (``state_buckets`` 64).  The versions before them
    keep their meaning in plans written earlier (a move to these is a migration, as
    ``theseus check`` says); what compiles today gets these.  None when nothing reads a
    table as a changelog."""
    out = g.copy()
    changed = False
    for sid in g.order():
        step = g[sid]
        ins = [plan.info[i] for i in step.inputs]
        if (isinstance(step, Source) and step.version == _source.CHANGELOG_VERSION
                and step.read is None and plan.info[sid].changelog):
            out.put(dataclasses.replace(step, version=_source.BUCKETS_VERSION))
        elif (isinstance(step, Aggregate) and step.version < _aggregate.ROWS_VERSION
              and ins and ins[0].changelog):
            out.put(dataclasses.replace(step, version=_aggregate.ROWS_VERSION))
        elif (isinstance(step, Join) and step.version < _join.BUCKETS_VERSION
              and len(ins) == 2 and all(i.changelog for i in ins)):
            out.put(dataclasses.replace(step, version=_join.BUCKETS_VERSION))
        else:
            continue
        changed = True
    return out if changed else None


def _casts(script: Script, g: ir.Graph, plan: Plan) -> ir.Graph | None:
    """A declared output table's types: cast what the query computes differently."""
    target = script.target
    assert target is not None
    if target.columns is None:
        return None
    top = g[g.sink].inputs[0]
    inferred = plan.info[top].columns
    changes = []
    for (_name, have), decl in zip(inferred, target.columns):
        if have not in (decl.type, T.UNKNOWN, "void") and not T.same_layout(have, decl.type):
            changes.append(decl.name)
    if not changes:
        return None
    out = g.copy()
    step = out[top]
    if not isinstance(step, Project) or top in script.tables:
        pid = _fresh(out, script, "select")
        names = out.columns(top)
        out.add(Project(id=pid, inputs=(top,),
                        columns=tuple(NamedExpr(n, ir.sql(ir.col(n))) for n in names)),
                script.query_span)
        out.rewire(out.sink, top, pid)
        step = out[pid]
    assert isinstance(step, Project)
    decl_types = {c.name: c.type for c in target.columns}
    cols = tuple(NamedExpr(c.name, ir.sql(exp.Cast(
        this=ir.paren(ir.parse(c.expr)), to=exp.DataType.build(decl_types[c.name],
                                                               dialect="spark"))))
        if c.name in changes else c for c in step.columns)
    out.put(dataclasses.replace(step, columns=cols))
    return out


__all__ = ["COMPILER_VERSION", "Compiled", "build_graph", "compile_script", "compile_sql"]
