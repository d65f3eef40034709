"""PySpark export, per step: the registry ``export_step`` and the helpers its writers share.

``theseus plan export --pyspark`` (``compat.export``) writes a plan as a PySpark job, one
variable per step.  Each step type registers with ``export_step``, in its own module, how
it is written: ``(node, plan) -> Code | Refusal``, the step's lines of ``build(spark)``
(unindented; ``var(id)`` names a step's DataFrame) and the version of the step that
``plan import`` reads back from them, or why the DataFrame API cannot say what the step
does.  A step type that no job can express registers its reason with ``refuse``.

Pure text, like the exporter: nothing here imports Spark, nor any step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import singledispatch
from typing import Any

from compat.model import Node, Plan


@dataclass(frozen=True)
class Code:
    """A step written as PySpark: its lines, and the version of the step that ``plan
    import`` gives back for them."""

    lines: list[str]
    version: int = 1


@dataclass(frozen=True)
class Refusal:
    """Why a step cannot be written as PySpark (the message names the step)."""

    why: str


@singledispatch
def export_step(node: Node, plan: Plan) -> Code | Refusal:
    """``node`` of ``plan`` as PySpark lines, or why it cannot be written.  Every step type
    registers its own (``@export_step.register``, or ``refuse``)."""
    raise NotImplementedError(f"no PySpark export is registered for step '{node.step}'")


#: the step types the DataFrame API cannot express at all, with why (see ``refuse``)
REFUSED: dict[type[Node], str] = {}


def refuse(reason: str, *classes: type[Node]) -> None:
    """Register ``classes`` as steps no PySpark job can express, for ``reason``."""
    def refused(node: Node, plan: Plan) -> Refusal:
        return Refusal(f"step '{node.id}' ({node.step}): {reason}")

    for cls in classes:
        REFUSED[cls] = reason
        export_step.register(cls, refused)


def bare(expr: str) -> bool:
    """Whether ``expr`` is a plain column name (backquoted or not)."""
    return re.fullmatch(r"`?[A-Za-z_][A-Za-z0-9_]*`?", expr.strip()) is not None


def py(value: Any) -> str:
    """A Python literal for a string (double quotes, as the project writes them)."""
    text = repr(value)
    if isinstance(value, str) and text.startswith("'") and '"' not in value:
        text = '"' + text[1:-1].replace("\\'", "'") + '"'
    return text


def var(nid: str) -> str:
    """The job's variable for the DataFrame of step ``nid``."""
    name = re.sub(r"\W", "_", nid)
    if not name or name[0].isdigit():
        name = "n_" + name
    return name + "_df" if name in _RESERVED else name


_RESERVED = {"F", "spark", "build", "os", "BOOTSTRAP", "CHECKPOINT", "def", "class", "if",
             "in", "is", "or", "and", "not", "for", "from", "import", "return", "with",
             "as", "lambda", "pass", "global", "None", "True", "False", "from_avro",
             "to_avro", "VALUE_SCHEMA", "value_header"}


def ident(name: str) -> str:
    """A column name as Spark SQL text: backquoted unless it is a plain identifier."""
    return name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else \
        "`" + name.replace("`", "``") + "`"


__all__ = ["REFUSED", "Code", "Refusal", "bare", "export_step", "ident", "py", "refuse",
           "var"]
