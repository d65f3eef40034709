"""Parsing a Spark SQL script with sqlglot, with sqlglot's errors turned into SqlErrors.

sqlglot reads ``window`` as the keyword of a ``WINDOW w AS (...)`` clause, so Spark's
``GROUP BY window(ts, '1 hour')`` and ``SELECT window.start`` do not parse.  Named window
clauses are not supported here, so every ``window`` token is read as an ordinary name before
the tokens reach the parser.
"""

from __future__ import annotations

import re

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

from compat.errors import SqlError
from compat.sql.text import SqlText

DIALECT = "spark"
_MISSING = re.compile(r"Missing (.+) from (\d+):(\d+)")


def parse_script(src: SqlText) -> list[exp.Expression]:
    """The statements of a script, in order (empty statements dropped)."""
    dialect = Dialect.get_or_raise(DIALECT)
    try:
        tokens = dialect.tokenize(src.text)
    except TokenError as e:
        raise _token_error(src, e) from None
    for tok in tokens:
        if tok.token_type == TokenType.WINDOW:
            tok.token_type = TokenType.VAR
    hints = [t for t in tokens if t.token_type == TokenType.HINT]
    try:
        statements = dialect.parser().parse(tokens, src.text)
    except ParseError as e:
        raise _parse_error(src, e) from None
    out = [s for s in statements if s is not None]
    _place_hints(out, hints)
    return out


def _place_hints(statements: list[exp.Expression], hints: list) -> None:
    """sqlglot parses a hint's text on its own, so positions inside it are offsets into the
    hint: drop them, and give each hint the position of its ``/*+ ... */`` token."""
    found = [h for s in statements for h in s.find_all(exp.Hint)]
    for node, tok in zip(found, hints):
        for n in node.walk():
            if n._meta:  # noqa: SLF001
                n._meta.pop("start", None)  # noqa: SLF001
                n._meta.pop("end", None)  # noqa: SLF001
        node.meta["span"] = (tok.start, tok.end + 1)


def _parse_error(src: SqlText, e: ParseError) -> SqlError:
    info = e.errors[0] if e.errors else {}
    line, col = info.get("line"), info.get("col")
    highlight = info.get("highlight") or ""
    message = str(info.get("description") or e).split(". Line ")[0]
    message = re.sub(r"<Token token_type: TokenType\.\w+, text: ([^,]*), .*?>", r"'\1'",
                     message)
    if not line or not col:
        return SqlError(f"syntax error: {message}", file=src.file)
    # sqlglot's column is where the highlighted token ends.
    start_col = max(1, col - len(highlight) + 1)
    source = src.line_text(line)
    return SqlError(f"syntax error: {message[0].lower() + message[1:]}", file=src.file,
                    line=line, col=start_col, source_line=source, length=len(highlight) or 1)


def _token_error(src: SqlText, e: TokenError) -> SqlError:
    cause = str(e.__cause__ or "")
    m = _MISSING.search(cause)
    if m:
        offset = int(m.group(3))
        line, col = src.position(offset)
        what = m.group(1)
        return SqlError(f"syntax error: unterminated {_QUOTES.get(what, what)}",
                        file=src.file, line=line, col=col, source_line=src.line_text(line),
                        length=len(src.line_text(line)) - col + 1)
    return SqlError(f"syntax error: cannot read the script ({cause or e})", file=src.file)


_QUOTES = {"'": "string (missing ')", '"': 'string (missing ")',
           "`": "quoted name (missing `)"}

__all__ = ["DIALECT", "parse_script"]
