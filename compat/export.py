"""``theseus plan export plan.json --pyspark``: a plan as a readable PySpark job.

The job's ``build(spark)`` returns the query's ``DataStreamWriter`` on Spark's own Kafka
connector, one variable per step, in the plan's order; ``theseus plan import`` of the
job gives the plan back (the round-trip test proves it on every fixture plan it can
write).  What the DataFrame API cannot say is refused with the step (``NOT_EXPORTABLE``):
Theseus builds those with stateful functions of its own.  Delivery and source partitions
are not part of a Spark job: the header says what to pass to ``plan import`` to get them
back.  Pure text: no Spark is imported here.
"""

from __future__ import annotations

import re
from typing import Any

from compat.errors import PlanError
from compat.infer import duration_seconds
from compat.model import Plan
from compat.steps.join import join_output, paired_keys

#: steps the DataFrame API cannot express, and why
NOT_EXPORTABLE = {
    "top_n": "Spark's DataFrame API has no streaming top-N; Theseus builds it with a "
             "stateful function of its own",
    "recursive": "Spark has no streaming recursion; Theseus builds the fixpoint with a "
                 "stateful loop of its own",
    "stop_gate": "gates are Theseus's own operators, inserted by the migrator",
    "start_gate": "gates are Theseus's own operators, inserted by the migrator",
}

_HOW = {"inner": "inner", "left": "left", "right": "right", "full": "full",
        "left_semi": "left_semi", "left_anti": "left_anti"}


def exportable(plan: Plan) -> str | None:
    """Why ``plan`` cannot be written as a PySpark job, or None."""
    extra = sorted(k for k in plan.config if k != "state_partitions")
    if extra:
        return (f"config {', '.join(extra)}: a Spark job holds no Theseus settings but its "
                "shuffle partitions")
    for nid in plan.nodes:
        node = plan.nodes[nid]
        windowed_key = node.step == "sink" and node.version == 2 and "window" in [
            n.lower() for n in plan.info[node.inputs[0]].names]
        if node.version != 1 and not windowed_key:
            return (f"step '{nid}' ({node.step}) is version {node.version}: a job's import "
                    "gives version 1 of every step (a windowed, window-keyed sink: 2)")
        if node.step in NOT_EXPORTABLE:
            return f"step '{nid}' ({node.step}): {NOT_EXPORTABLE[node.step]}"
        if node.step == "source" and node.role == "table":
            return (f"source '{nid}' is a table (latest value per key): a Spark job reads "
                    "a Kafka topic as a stream or as every record")
        if node.step == "join" and not all(_bare(k) for k in node.left_keys + node.right_keys):
            return f"join '{nid}' has expression keys (only column keys are written)"
        if node.step == "source" and node.key_columns:
            return (f"source '{nid}' reads key columns from the record key: a job reads "
                    "the record value only")
        if node.step == "deduplicate" and node.within:
            delays = _watermarks(plan, nid)
            if delays != {duration_seconds(node.within)}:
                return (f"deduplicate '{nid}' keeps keys for {node.within}, not for its "
                        "watermark delay: Spark's dropDuplicatesWithinWatermark keeps them "
                        "for the watermark delay")
    return None


def _watermarks(plan: Plan, nid: str) -> set[float | None]:
    """The watermark delays (seconds) of the sources upstream of ``nid``."""
    out: set[float | None] = set()
    stack = [nid]
    while stack:
        node = plan.nodes[stack.pop()]
        if node.step == "source":
            out.add(duration_seconds(node.event_time.watermark) if node.event_time
                    else None)
        stack.extend(node.inputs)
    return out


def _bare(expr: str) -> bool:
    return re.fullmatch(r"`?[A-Za-z_][A-Za-z0-9_]*`?", expr.strip()) is not None


def _py(value: Any) -> str:
    """A Python literal for a string (double quotes, as the project writes them)."""
    text = repr(value)
    if isinstance(value, str) and text.startswith("'") and '"' not in value:
        text = '"' + text[1:-1].replace("\\'", "'") + '"'
    return text


def _var(nid: str) -> str:
    name = re.sub(r"\W", "_", nid)
    if not name or name[0].isdigit():
        name = "n_" + name
    return name + "_df" if name in _RESERVED else name


_RESERVED = {"F", "spark", "build", "os", "BOOTSTRAP", "CHECKPOINT", "def", "class", "if",
             "in", "is", "or", "and", "not", "for", "from", "import", "return", "with",
             "as", "lambda", "pass", "global", "None", "True", "False"}


def _ident(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else \
        "`" + name.replace("`", "``") + "`"


def to_pyspark(plan: Plan) -> str:
    why = exportable(plan)
    if why is not None:
        raise PlanError(f"the plan cannot be written as a PySpark job: {why}",
                        file=plan.file, expected="steps the DataFrame API has",
                        found=why.split(":")[0])
    parts = {n.topic: n.partitions for n in plan.nodes.values() if n.step == "source"}
    lines = [
        f'"""The query \'{plan.query}\' as a PySpark job (written by theseus plan export '
        '--pyspark).',
        "",
        "Run it with Spark's Kafka connector (spark-sql-kafka-0-10):",
        "    KAFKA_BOOTSTRAP=host:9092 CHECKPOINT=dir spark-submit ... (build(spark).start())",
        "Import it back with:",
        f"    theseus plan import THIS.py --delivery {plan.sink.delivery}"
        + (f" --partitions {next(iter(parts.values()))}" if len(set(parts.values())) == 1
           else ""),
        "(a Spark job does not say its topics' partitions nor its sink's delivery).",
        '"""',
        "",
        "import os",
        "",
        "from pyspark.sql import functions as F",
        "",
        'BOOTSTRAP = os.environ.get("KAFKA_BOOTSTRAP", "localhost:9092")',
        f'CHECKPOINT = os.environ.get("CHECKPOINT", {_py("checkpoints/" + plan.query)})',
        "",
        "",
        "def build(spark):",
        f'    spark.conf.set("spark.sql.shuffle.partitions", '
        f'"{plan.config.get("state_partitions", 200)}")',
    ]
    for nid in plan.nodes:
        node = plan.nodes[nid]
        lines.extend("    " + ln for ln in _aligned(_step(plan, nid, node)))
    return "\n".join(lines) + "\n"


def _aligned(step: list[str]) -> list[str]:
    """Continuation lines under the first line's opening parenthesis."""
    if len(step) < 2 or "(" not in step[0]:
        return step
    pad = " " * (step[0].index("(") + 1)
    return [step[0]] + [pad + ln.lstrip() for ln in step[1:]]


def _step(plan: Plan, nid: str, node: Any) -> list[str]:
    v = _var(nid)
    ins = [_var(i) for i in node.inputs]
    step = node.step
    if step == "source":
        out = [f"{v} = (spark.readStream.format(\"kafka\")",
               '      .option("kafka.bootstrap.servers", BOOTSTRAP)',
               f'      .option("subscribe", {_py(node.topic)})',
               f'      .option("startingOffsets", {_py(node.starting_offsets)})',
               "      .load()"]
        if node.format == "string":
            out.append(f'      .select(F.col("value").cast("string")'
                       f'.alias({_py(node.schema[0].name)}))')
        else:
            ddl = ", ".join(f"{_ident(c.name)} {c.type}" for c in node.schema)
            out += [f'      .select(F.from_json(F.col("value").cast("string"), '
                    f'{_py(ddl)}).alias("v"))',
                    '      .select("v.*")']
        if node.event_time:
            out.append(f"      .withWatermark({_py(node.event_time.column)}, "
                       f"{_py(node.event_time.watermark)})")
        out[-1] += ")"
        return out
    if step == "filter":
        return [f"{v} = {ins[0]}.where(F.expr({_py(node.predicate)}))"]
    if step == "project":
        cols = ", ".join(f"F.expr({_py(c.expr)}).alias({_py(c.name)})" for c in node.columns)
        return [f"{v} = {ins[0]}.select({cols})"]
    if step == "explode":
        fn = "explode_outer" if node.outer else "explode"
        return [f'{v} = {ins[0]}.select("*", F.{fn}(F.expr({_py(node.expr)}))'
                f".alias({_py(node.alias)}))"]
    if step == "union":
        return [f"{v} = {ins[0]}" + "".join(f".union({i})" for i in ins[1:])]
    if step == "deduplicate":
        fn = "dropDuplicatesWithinWatermark" if node.within else "dropDuplicates"
        return [f"{v} = {ins[0]}.{fn}({list(node.keys)!r})"]
    if step == "aggregate":
        keys = []
        w = node.window
        if w is not None:
            if w.type == "session":
                keys.append(f"F.session_window({_py(w.column)}, {_py(w.gap or w.size)})"
                            '.alias("window")')
            elif w.type == "hopping":
                keys.append(f"F.window({_py(w.column)}, {_py(w.size)}, {_py(w.slide)})")
            else:
                keys.append(f"F.window({_py(w.column)}, {_py(w.size)})")
        keys += [f"F.expr({_py(g.expr)}).alias({_py(g.name)})" for g in node.group_by]
        aggs = []
        for a in node.aggregates:
            text = f"{a.function}({'DISTINCT ' if a.distinct else ''}{', '.join(a.args)})"
            aggs.append(f"F.expr({_py(text)}).alias({_py(a.name)})")
        return [f"{v} = ({ins[0]}.groupBy({', '.join(keys)})",
                f"      .agg({', '.join(aggs)}))"]
    if step == "join":
        lid, rid = node.inputs
        conds = [f"{lid}.{_ident(lk.strip('`'))} = {rid}.{_ident(rk.strip('`'))}"
                 for lk, rk in zip(node.left_keys, node.right_keys)]
        conds += [c for c in (node.condition, node.time_bound) if c]
        cond = " AND ".join(f"({c})" if len(conds) > 1 else c for c in conds) or "true"
        lnames, rnames = plan.info[lid].names, plan.info[rid].names
        paired = paired_keys(node) if node.type in ("right", "full") else set()
        cols = []
        right_names = {n.lower(): n for n in rnames}
        for name, side, src in join_output(node, lnames, rnames):
            ref = f"F.col({_py((lid if side == 'left' else rid) + '.' + _ident(src))})"
            if side == "left" and src.lower() in paired:
                ref = (f"F.coalesce({ref}, F.col("
                       f"{_py(rid + '.' + _ident(right_names[src.lower()]))}))")
            cols.append(f"{ref}.alias({_py(name)})")
        return [f"{v} = ({ins[0]}.alias({_py(lid)})",
                f"      .join({ins[1]}.alias({_py(rid)}), F.expr({_py(cond)}), "
                f"{_py(_HOW[node.type])})",
                f"      .select({', '.join(cols)}))"]
    if step == "sink":
        names = plan.info[node.inputs[0]].names
        key = list(node.key_columns)
        if node.version >= 2 and "window" in [n.lower() for n in names] and \
                "window" not in [k.lower() for k in key]:
            key.append(next(n for n in names if n.lower() == "window"))
        if node.format == "string":
            value = f"F.col({_py(names[0])}).cast(\"string\").alias(\"value\")"
        else:
            value = f"F.to_json(F.struct({', '.join(_py(n) for n in names)}))" \
                    '.alias("value")'
        cols = ([f"F.to_json(F.struct({', '.join(_py(k) for k in key)})).alias(\"key\")"]
                if key else []) + [value]
        return [f"return ({ins[0]}.select({', '.join(cols)})",
                f'        .writeStream.format("kafka").queryName({_py(plan.query)})',
                '        .option("kafka.bootstrap.servers", BOOTSTRAP)',
                f'        .option("topic", {_py(node.topic)})',
                '        .option("checkpointLocation", CHECKPOINT)',
                f"        .outputMode({_py(node.mode)}))"]
    raise PlanError(f"step '{nid}' ({step}) cannot be written as PySpark", file=plan.file,
                    node=nid, expected="a step the DataFrame API has", found=step)


__all__ = ["NOT_EXPORTABLE", "exportable", "to_pyspark"]
