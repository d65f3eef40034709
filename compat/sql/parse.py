"""Parsing a Spark SQL script with sqlglot, with sqlglot's errors turned into SqlErrors.

The script is tokenized once and parsed one statement at a time, so that every statement
(even one sqlglot can only keep as an opaque command) is known by its position.

sqlglot reads ``window`` as the keyword of a ``WINDOW w AS (...)`` clause, so Spark's
``GROUP BY window(ts, '1 hour')`` and ``SELECT window.start`` do not parse: a ``window``
token that does not start such a clause is read as an ordinary name.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import Token, TokenType

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
    for i, tok in enumerate(tokens):
        if tok.token_type == TokenType.WINDOW and not _window_clause(tokens, i):
            tok.token_type = TokenType.VAR
    out: list[exp.Expression] = []
    for chunk in _statements(tokens):
        _refuse_empty_items(src, chunk)
        hints = [t for t in chunk if t.token_type == TokenType.HINT]
        try:
            with _quiet():
                parsed = dialect.parser().parse(chunk, src.text)
        except ParseError as e:
            raise _parse_error(src, e, chunk) from None
        except TokenError as e:  # raised from inside: sqlglot tokenizes a hint's text apart
            raise _hint_error(src, e, hints or chunk) from None
        for stmt in parsed:
            if stmt is None or isinstance(stmt, exp.Semicolon):
                continue
            if isinstance(stmt, exp.Command):
                raise _command_error(src, stmt, chunk)
            _place_hints(stmt, hints)
            out.append(stmt)
    return out


#: what may not follow a comma in Spark's grammar (sqlglot skips the empty item)
_NOT_AFTER_COMMA = {TokenType.COMMA, TokenType.R_PAREN, TokenType.FROM, TokenType.WHERE,
                    TokenType.GROUP_BY, TokenType.HAVING, TokenType.ORDER_BY,
                    TokenType.LIMIT}
#: what a comma may not follow
_NOT_BEFORE_COMMA = {TokenType.SELECT, TokenType.L_PAREN, TokenType.GROUP_BY,
                     TokenType.DISTINCT}


def _refuse_empty_items(src: SqlText, chunk: list[Token]) -> None:
    """``SELECT url,, ts``, ``f(a,)``, ``SELECT , a``: Spark's parser refuses an empty item
    in a list; sqlglot drops it silently."""
    for i, tok in enumerate(chunk):
        if tok.token_type != TokenType.COMMA:
            continue
        nxt = chunk[i + 1] if i + 1 < len(chunk) else None
        prev = chunk[i - 1] if i else None
        if nxt is None or nxt.token_type in _NOT_AFTER_COMMA:
            near = nxt or tok
            what = "between two commas" if nxt is not None and \
                nxt.token_type == TokenType.COMMA else f"after ',' and before {_shown(nxt)}"
        elif prev is None or prev.token_type in _NOT_BEFORE_COMMA:
            near, what = tok, f"before ',' (after {_shown(prev)})"
        else:
            continue
        raise src.error(f"syntax error at or near {_shown(near)}: expected an expression "
                        f"{what}", (near.start, near.end + 1))


def _shown(tok: Token | None) -> str:
    return "the end of the statement" if tok is None else f"'{tok.text}'"


def _window_clause(tokens: list[Token], i: int) -> bool:
    """``WINDOW w AS (...)``: a name and AS follow."""
    return i + 2 < len(tokens) and tokens[i + 1].token_type in (TokenType.VAR,
                                                                  TokenType.IDENTIFIER) \
        and tokens[i + 2].token_type == TokenType.ALIAS


def _statements(tokens: list[Token]) -> Iterator[list[Token]]:
    chunk: list[Token] = []
    for tok in tokens:
        if tok.token_type == TokenType.SEMICOLON:
            if chunk:
                yield chunk
            chunk = []
        else:
            chunk.append(tok)
    if chunk:
        yield chunk


@contextmanager
def _quiet() -> Iterator[None]:
    """sqlglot logs a warning when it keeps a statement as a command; the error is ours."""
    log = logging.getLogger("sqlglot")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _place_hints(stmt: exp.Expression, hints: list[Token]) -> None:
    """sqlglot parses a hint's text on its own, so positions inside it are offsets into the
    hint: drop them, and give each hint the position of its ``/*+ ... */`` token."""
    for node, tok in zip(stmt.find_all(exp.Hint), hints):
        for n in node.walk():
            if n._meta:  # noqa: SLF001
                n._meta.pop("start", None)  # noqa: SLF001
                n._meta.pop("end", None)  # noqa: SLF001
        node.meta["span"] = (tok.start, tok.end + 1)


def _command_error(src: SqlText, stmt: exp.Command, chunk: list[Token]) -> SqlError:
    word = str(stmt.this).upper()
    span = (chunk[0].start, chunk[-1].end + 1)
    if word == "SET":
        return src.error("SET needs a key and a value: SET key = value", span)
    return src.error(f"cannot read this {word} statement: unsupported syntax (a script holds "
                     "SET, CREATE TABLE ... USING kafka, CREATE VIEW and one INSERT INTO or "
                     "CREATE TABLE ... AS SELECT)", span)


#: the operators whose operand sqlglot finds missing, by its expression class, as written
_OPERATORS = {"And": "AND", "Or": "OR", "Xor": "XOR", "Not": "NOT", "GT": ">", "GTE": ">=",
              "LT": "<", "LTE": "<=", "EQ": "=", "NEQ": "<>", "NullSafeEQ": "<=>", "Add": "+",
              "Sub": "-", "Mul": "*", "Div": "/", "IntDiv": "DIV", "Mod": "%", "DPipe": "||",
              "BitwiseAnd": "&", "BitwiseOr": "|", "BitwiseXor": "^", "Like": "LIKE",
              "ILike": "ILIKE", "RegexpLike": "RLIKE", "Is": "IS", "In": "IN",
              "Between": "BETWEEN", "Escape": "ESCAPE"}
_REQUIRED = re.compile(r"[Rr]equired keyword: '(\w+)' missing for <class '[\w.]*?(\w+)'>")


def _before(chunk: list[Token], line: int, col: int) -> list[Token]:
    """The tokens of the statement up to the one the parser stopped at, last first."""
    return [t for t in reversed(chunk) if (t.line, t.col) <= (line, col)]


def _missing_operand(src: SqlText, m: re.Match[str], chunk: list[Token], line: int,
                     col: int) -> SqlError | None:
    """sqlglot's ``required keyword: 'this' missing for <class ...And>`` said as Spark
    says it: at or near which token, and what was expected where."""
    key, klass = m.group(1), m.group(2)
    op = _OPERATORS.get(klass)
    if op is None:
        return None
    tok = next((t for t in _before(chunk, line, col) if t.text.upper() == op), None)
    if tok is None:
        return None
    side = "before" if key == "this" else "after"
    tline, tcol = src.position(tok.start)
    return SqlError(f"syntax error at or near '{tok.text}': expected an expression {side} "
                    f"{op}", file=src.file, line=tline, col=tcol,
                    source_line=src.line_text(tline), length=tok.end - tok.start + 1)


def _parse_error(src: SqlText, e: ParseError, chunk: list[Token] | None = None) -> SqlError:
    info = e.errors[0] if e.errors else {}
    line, col = info.get("line"), info.get("col")
    highlight = info.get("highlight") or ""
    message = str(info.get("description") or e).split(". Line ")[0]
    message = re.sub(r"<Token token_type: TokenType\.\w+, text: ([^,]*), .*?>", r"'\1'",
                     message)
    m = _REQUIRED.search(message)
    if m and line and col and chunk:
        said = _missing_operand(src, m, chunk, line, col)
        if said is not None:
            return said
    if m:  # never the parser's internals: where it stopped, in Spark's words
        near = f" at or near '{highlight}'" if highlight else ""
        message = f"incomplete {m.group(2).lower()} expression{near}"
    message = re.sub(r"<class '[\w.]*?(\w+)'>", r"\1", message)
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


def _hint_error(src: SqlText, e: TokenError, where: list[Token]) -> SqlError:
    cause = str(e.__cause__ or e)
    m = _MISSING.search(cause)
    what = f"unterminated {_QUOTES.get(m.group(1), m.group(1))}" if m else "unreadable text"
    return src.error(f"syntax error: {what} in a /*+ ... */ hint",
                     (where[0].start, where[0].end + 1))


_QUOTES = {"'": "string (missing ')", '"': 'string (missing ")',
           "`": "quoted name (missing `)"}

__all__ = ["DIALECT", "parse_script"]
