"""The SQL text being compiled: offsets to line and column, and errors that point into it.

sqlglot records on identifiers, literals and many function nodes where their token starts and
ends (``meta['start']``/``meta['end']``, inclusive character offsets).  A node without its own
position (an operator, a keyword clause) spans the positions of everything under it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass

from sqlglot import exp

from compat.errors import SqlError

#: a half-open character range ``[start, end)`` in the SQL text
Span = tuple[int, int]


def span_of(node: exp.Expression | None) -> Span | None:
    """The smallest range covering every token position recorded in ``node``'s tree."""
    if node is None:
        return None
    lo: int | None = None
    hi: int | None = None
    for n in node.walk():
        meta = n._meta  # noqa: SLF001 - avoid creating empty meta dicts on every node
        if meta and "start" in meta and "end" in meta:
            s, e = meta["start"], meta["end"] + 1
            lo = s if lo is None else min(lo, s)
            hi = e if hi is None else max(hi, e)
        elif meta and "span" in meta:
            s, e = meta["span"]
            lo = s if lo is None else min(lo, s)
            hi = e if hi is None else max(hi, e)
    if lo is None or hi is None:
        return None
    return lo, hi


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest candidate, or nothing."""
    pool = sorted({c for c in candidates if c})
    lowered = {c.lower(): c for c in pool}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.6)
    return f" (did you mean '{lowered[close[0]]}'?)" if close else ""


@dataclass(frozen=True)
class SqlText:
    """A script and the file it came from."""

    text: str
    file: str = "<sql>"

    def position(self, offset: int) -> tuple[int, int]:
        """1-based line and column of a character offset."""
        offset = max(0, min(offset, len(self.text)))
        line = self.text.count("\n", 0, offset) + 1
        start = self.text.rfind("\n", 0, offset) + 1
        return line, offset - start + 1

    def _close_parens(self, span: Span, call: bool) -> Span:
        """Extend a span to its closing parentheses: sqlglot records where a function's
        name is, not where its call ends (``sum(amount)`` would be marked ``sum(amount``)."""
        start, end = span
        text = self.text
        depth = 0
        for ch in text[start:end]:
            depth += {"(": 1, ")": -1}.get(ch, 0)
        if call and depth == 0:
            i = end
            while i < len(text) and text[i] in " \t":
                i += 1
            if i < len(text) and text[i] == "(":
                end, depth = i + 1, 1
        while depth > 0 and end < len(text) and text[end] != "\n":
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            end += 1
        return start, end

    def find_after(self, word: str, offset: int | None) -> Span | None:
        """The first occurrence of ``word`` from ``offset`` on."""
        if offset is None:
            return None
        i = self.text.lower().find(word.lower(), offset)
        return (i, i + len(word)) if i >= 0 else None

    def find_before(self, word: str, offset: int | None) -> Span | None:
        """The last occurrence of ``word`` before ``offset`` (for nodes sqlglot left without
        a position, such as the unquoted keys of OPTIONS)."""
        if offset is None:
            return None
        i = self.text.lower().rfind(word.lower(), 0, offset)
        return (i, i + len(word)) if i >= 0 else None

    def line_text(self, line: int) -> str:
        lines = self.text.split("\n")
        return lines[line - 1] if 0 < line <= len(lines) else ""

    def error(self, message: str, where: exp.Expression | Span | None = None,
              **kw: object) -> SqlError:
        """A SqlError pointing at a node (or a span); without a position, at the file."""
        span = where if isinstance(where, tuple) else span_of(where)
        if span is None:
            return SqlError(message, file=self.file, **kw)  # type: ignore[arg-type]
        start, end = self._close_parens(span, isinstance(where, exp.Func))
        line, col = self.position(start)
        source = self.line_text(line)
        # An underline stops at the end of its line; a span over several lines marks the rest
        # of the first one.
        length = max(1, min(end, start + len(source) - col + 1) - start)
        return SqlError(message, file=self.file, line=line, col=col, source_line=source,
                        length=length, **kw)  # type: ignore[arg-type]


__all__ = ["Span", "SqlText", "did_you_mean", "span_of"]
