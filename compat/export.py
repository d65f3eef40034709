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
    avro_in = any(isinstance(n, Source) and n.format == "avro" for n in plan.nodes.values())
    avro_out = plan.sink.format == "avro"
    avro = avro_in or avro_out
    functions = ", ".join(f for f, used in (("from_avro", avro_in), ("to_avro", avro_out))
                          if used)
    lines = [
        f'"""The query \'{plan.query}\' as a PySpark job (written by theseus plan export '
        '--pyspark).',
        "",
        "Run it with Spark's Kafka connector (spark-sql-kafka-0-10)"
        + (" and spark-avro:" if avro else ":"),
        "    KAFKA_BOOTSTRAP=host:9092 CHECKPOINT=dir "
        + ("SCHEMA_REGISTRY_URL=url " if avro_out else "")
        + "spark-submit ... (build(spark).start())",
        "Import it back with:",
        f"    theseus plan import THIS.py --delivery {plan.sink.delivery}"
        + (f" --partitions {next(iter(parts.values()))}" if len(set(parts.values())) == 1
           else ""),
        "(a Spark job does not say its topics' partitions nor its sink's delivery"
        + ("; build() asks the registry for the output schema's id, at import too)."
           if avro_out else ")."),
        '"""',
        "",
        "import os",
        "",
        "from pyspark.sql import functions as F",
        *([f"from pyspark.sql.avro.functions import {functions}"] if avro else []),
        "",
        'BOOTSTRAP = os.environ.get("KAFKA_BOOTSTRAP", "localhost:9092")',
        f'CHECKPOINT = os.environ.get("CHECKPOINT", {py("checkpoints/" + plan.query)})',
        *(_avro_output(plan) if avro_out else []),
        "",
        "",
        "def build(spark):",
        f'    spark.conf.set("spark.sql.shuffle.partitions", '
        f'"{plan.config.get("state_partitions", 200)}")',
    ]
    for code in written:
        lines.extend("    " + ln for ln in _aligned(code.lines))
    return "\n".join(lines) + "\n"


def _avro_output(plan: Plan) -> list[str]:
    """An Avro sink's writer schema, and how the job learns the id the registry gives it:
    Spark's to_avro writes the body alone, the wire format's header is the job's."""
    from compat import avro as A
    from compat.steps.sink import avro_schema

    schema = A.canonical(avro_schema(plan.sink, plan.info[plan.sink.inputs[0]]))
    return [f"VALUE_SCHEMA = {py(schema)}", "", "", *VALUE_HEADER.splitlines()]


#: the exported job's registry call (the standard library's, as the job has no other)
VALUE_HEADER = '''def value_header(subject, schema):
    """The schema registry's wire-format header of the values: a zero byte, then the id
    of `schema` under `subject` (registered if new) at $SCHEMA_REGISTRY_URL."""
    import json
    import urllib.parse
    import urllib.request

    url = os.environ.get("SCHEMA_REGISTRY_URL")
    if not url:
        raise RuntimeError("SCHEMA_REGISTRY_URL is not set: the job's Avro values start "
                           "with the id their schema has in the registry")
    req = urllib.request.Request(
        f"{url.rstrip('/')}/subjects/{urllib.parse.quote(subject, safe='')}/versions",
        data=json.dumps({"schema": schema, "schemaType": "AVRO"}).encode(), method="POST",
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return b"\\x00" + json.load(resp)["id"].to_bytes(4, "big")'''


def _aligned(step: list[str]) -> list[str]:
    """Continuation lines under the first line's opening parenthesis."""
    if len(step) < 2 or "(" not in step[0]:
        return step
    pad = " " * (step[0].index("(") + 1)
    return [step[0]] + [pad + ln.lstrip() for ln in step[1:]]


__all__ = ["NOT_EXPORTABLE", "exportable", "to_pyspark"]
