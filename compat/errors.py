"""One exception root for Theseus; each phase has its own subclass with its own exit code.

Every message says *where* (file, node id, JSON pointer), *what was expected* and *what was
found*.  Errors become exit codes in exactly one place: the CLI.
"""

from __future__ import annotations


class TheseusError(Exception):
    """Root of every error Theseus raises on purpose."""

    exit_code = 2

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        node: str | None = None,
        pointer: str | None = None,
        expected: str | None = None,
        found: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.message = message
        self.file = file
        self.node = node
        self.pointer = pointer
        self.expected = expected
        self.found = found
        self.hint = hint
        super().__init__(self.render())

    def where(self) -> str:
        parts = []
        if self.file:
            parts.append(self.file)
        if self.node:
            parts.append(f"node '{self.node}'")
        if self.pointer is not None:
            parts.append(f"at {self.pointer or '/'}")
        return ", ".join(parts)

    def render(self) -> str:
        where = self.where()
        text = f"{where}: {self.message}" if where else self.message
        if self.expected is not None or self.found is not None:
            text += f" (expected {self.expected}, found {self.found})"
        if self.hint:
            text += f". {self.hint}"
        return text

    def with_location(self, *, file: str | None = None, node: str | None = None,
                      pointer: str | None = None) -> TheseusError:
        """Fill in location parts that a lower layer could not know."""
        self.file = self.file or file
        self.node = self.node or node
        if self.pointer is None:
            self.pointer = pointer
        self.args = (self.render(),)
        return self


class PlanError(TheseusError):
    """A plan file cannot be read, parsed or validated."""


class ExpressionError(PlanError):
    """An expression string is not valid Spark SQL, or uses a refused function."""

    def __init__(self, message: str, *, column: int | None = None, **kw: object) -> None:
        self.column = column
        super().__init__(message, **kw)  # type: ignore[arg-type]


class SqlError(TheseusError):
    """A SQL script cannot be compiled into a plan.

    Points at ``file:line:col`` and, when the offending line is known, repeats it with the
    offending text underlined (``^^^``), the way compilers do.
    """

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 col: int | None = None, source_line: str | None = None, length: int = 1,
                 **kw: object) -> None:
        self.line = line
        self.col = col
        self.source_line = source_line
        self.length = max(1, length)
        super().__init__(message, file=file, **kw)  # type: ignore[arg-type]

    def where(self) -> str:
        if self.line is None:
            return super().where()
        return f"{self.file or '<sql>'}:{self.line}:{self.col or 1}"

    def render(self) -> str:
        text = super().render()
        if self.source_line is not None and self.col is not None:
            line = self.source_line.rstrip("\r\n")
            col = self.col
            if len(line) > _SHOWN:  # a window of a long line around the column
                start = max(0, min(col - 1 - _SHOWN // 3, len(line) - _SHOWN))
                line = ("..." if start else "") + line[start:start + _SHOWN] + \
                    ("..." if start + _SHOWN < len(line) else "")
                col = col - start + (3 if start else 0)
            # Keep tabs in the indent so the carets line up under the text they mark.
            indent = "".join(ch if ch == "\t" else " " for ch in line[:col - 1])
            width = min(self.length, max(1, len(line) - col + 1))
            text += f"\n    {line}\n    {indent}{'^' * width}"
        return text


#: how much of a long source line an error repeats (a generated script may be one line)
_SHOWN = 240


class JobError(TheseusError):
    """A PySpark job file cannot become a plan (``theseus plan import``): the file raises
    on import, its function returns something else than a ``DataStreamWriter``, or the
    query uses what a plan cannot express (a UDF, ``foreachBatch``, a source that is not
    Kafka...).  Points at ``file:line`` when Python can tell the line."""

    def __init__(self, message: str, *, line: int | None = None, **kw: object) -> None:
        self.line = line
        super().__init__(message, **kw)  # type: ignore[arg-type]

    def where(self) -> str:
        base = super().where()
        if self.line is not None and self.file:
            return base.replace(self.file, f"{self.file}:{self.line}", 1)
        return base


class CheckError(TheseusError):
    """The checker was called wrongly (bad flag values, git ref not found...)."""


class FleetError(TheseusError):
    """A fleet of plans is invalid as a whole: two queries write one topic, two plans share
    a query name, a file in the fleet's tree is not a plan."""


class RuntimeFailure(TheseusError):
    """Running a plan on Spark or Kafka failed."""

    exit_code = 4


class MigrationError(TheseusError):
    """A migration could not proceed."""

    exit_code = 5


class Refused(TheseusError):
    """An operation refused before it changed anything, because of the state it found: the
    migration is owned by another live process (its lease), a guard tripped (a destructive
    reconciliation, a missing topic), or there is nothing it could act on.  Distinct from a
    failed step (5): running it again later, or as the message says, is safe."""

    exit_code = 6


class Unsupported(Refused):
    """Refused because the change cannot be done live at all, whatever the state: the
    checker's ``unsupported`` verdict, or a plan the migrator cannot cut (two recursive
    steps, a downstream fed by two queries of a cascade).  Exit 3, as ``theseus check``
    says ``unsupported``."""

    exit_code = 3


class InvalidRequest(Refused):
    """Refused because what was asked contradicts the plans, whatever the state: flags that
    cannot apply to this upgrade (``--strategy in-place`` for an upgrade that needs a
    shadow, ``--reconcile on`` for an output without keys), plans that do not form a
    cascade.  Exit 2, as for any invalid input."""

    exit_code = 2


class StoreError(RuntimeFailure):
    """The store (a directory, or its Kafka mirror) cannot be read or written."""


class GateError(RuntimeFailure):
    """A gate failed at run time: control events, the gated source or sink, gate state.

    Errors about Kafka point at a ``topic`` and ``partition`` where other errors name a file.
    """

    def __init__(self, message: str, *, topic: str | None = None,
                 partition: int | None = None, **kw: object) -> None:
        self.topic = topic
        self.partition = partition
        super().__init__(message, **kw)  # type: ignore[arg-type]

    def where(self) -> str:
        base = super().where()
        parts = [base] if base else []
        if self.topic is not None:
            parts.append(f"topic '{self.topic}'")
        if self.partition is not None:
            parts.append(f"partition {self.partition}")
        return ", ".join(parts)


class BrokerError(GateError):
    """A Kafka call failed: the broker does not answer, a topic does not exist..."""


class ControlError(GateError):
    """Writing control events failed (unknown topic, delivery error, timeout)."""


class SourceError(GateError):
    """The gated source is misconfigured, or cannot read what Kafka holds."""


class SinkError(GateError):
    """A micro-batch could not be written (delivery failure, fenced producer, timeout)."""


class GateStateError(GateError):
    """A gate or acknowledgement file is unreadable or malformed."""


class OffsetRegression(GateError):
    """An offset went backwards where it may only move forward (an acknowledgement, the cut
    against the high watermarks): a bug, a topic deleted and created again, or a query
    restarted from an older checkpoint.  Reported, never papered over."""


class DeadlineExceeded(MigrationError):
    """The migration's time budget ran out; the message names what it was waiting for."""
