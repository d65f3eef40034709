"""``theseus plan export plan.json --pyspark``: a plan as a readable PySpark job.

The job's ``build(spark)`` returns the query's ``DataStreamWriter`` on Spark's own Kafka
connector, one variable per step, in the plan's order; ``theseus plan import`` of the
job gives the plan back (the round-trip test proves it on every fixture plan it can
write).  Each step is written by its own module's ``export_step`` registration
(``compat.pyspark_text``); what the DataFrame API cannot say is refused there, with the
step (``NOT_EXPORTABLE``): Theseus builds those with stateful functions of its own.
Delivery and source partitions are not part of a Spark job: the header says what to pass
to ``plan import`` to get them back.  Pure text: no Spark is imported here.
"""

from __future__ import annotations

from compat.errors import PlanError
from compat.model import Plan
from compat.pyspark_text import REFUSED, Code, export_step, py
from compat.steps import Source

#: steps the DataFrame API cannot express, and why (each step's module says so)
NOT_EXPORTABLE = {cls.step: why for cls, why in REFUSED.items()}


def exportable(plan: Plan) -> str | None:
    """Why ``plan`` cannot be written as a PySpark job, or None."""
    written = _written(plan)
    return written if isinstance(written, str) else None


def _written(plan: Plan) -> list[Code] | str:
    """Every step of ``plan`` written as PySpark, in the plan's order, or why not."""
    extra = sorted(k for k in plan.config if k != "state_partitions")
    if extra:
        return (f"config {', '.join(extra)}: a Spark job holds no Theseus settings but its "
                "shuffle partitions")
    out = []
    for nid, node in plan.nodes.items():
        code = export_step(node, plan)
        # The version first, whatever else the step says: the job must import back as it.
        if node.version != (code.version if isinstance(code, Code) else 1):
            return (f"step '{nid}' ({node.step}) is version {node.version}: a job's import "
                    "gives version 1 of every step (a windowed, window-keyed sink: 2)")
        if not isinstance(code, Code):
            return code.why
        out.append(code)
    return out


def to_pyspark(plan: Plan) -> str:
    written = _written(plan)
    if isinstance(written, str):
        raise PlanError(f"the plan cannot be written as a PySpark job: {written}",
                        file=plan.file, expected="steps the DataFrame API has",
                        found=written.split(":")[0])
    parts = {n.topic: n.partitions for n in plan.nodes.values() if isinstance(n, Source)}
    avro = any(isinstance(n, Source) and n.format == "avro" for n in plan.nodes.values())
    lines = [
        f'"""The query \'{plan.query}\' as a PySpark job (written by theseus plan export '
        '--pyspark).',
        "",
        "Run it with Spark's Kafka connector (spark-sql-kafka-0-10)"
        + (" and spark-avro:" if avro else ":"),
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
        *(["from pyspark.sql.avro.functions import from_avro"] if avro else []),
        "",
        'BOOTSTRAP = os.environ.get("KAFKA_BOOTSTRAP", "localhost:9092")',
        f'CHECKPOINT = os.environ.get("CHECKPOINT", {py("checkpoints/" + plan.query)})',
        "",
        "",
        "def build(spark):",
        f'    spark.conf.set("spark.sql.shuffle.partitions", '
        f'"{plan.config.get("state_partitions", 200)}")',
    ]
    for code in written:
        lines.extend("    " + ln for ln in _aligned(code.lines))
    return "\n".join(lines) + "\n"


def _aligned(step: list[str]) -> list[str]:
    """Continuation lines under the first line's opening parenthesis."""
    if len(step) < 2 or "(" not in step[0]:
        return step
    pad = " " * (step[0].index("(") + 1)
    return [step[0]] + [pad + ln.lstrip() for ln in step[1:]]


__all__ = ["NOT_EXPORTABLE", "exportable", "to_pyspark"]
