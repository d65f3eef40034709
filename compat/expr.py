"""Spark SQL expressions: a small parser, canonical form, column references and types.

Plans carry expressions as Spark SQL strings.  ``theseus check`` must start fast and must not
import a full SQL library on the happy path, so this module holds a compact Pratt parser for
the expression subset plans use (operators, functions, CASE, CAST, IN, BETWEEN, LIKE, IS,
lambdas, subscripts, intervals).  An expression it cannot parse is handed to sqlglot's Spark
dialect as a second opinion before it is declared invalid, so a valid Spark expression outside
the subset is accepted (as an *opaque* expression) rather than refused.

The AST is made of plain tuples so it hashes, compares and caches cheaply:

    ("col", ("r", "ts"))            column reference, lower-cased parts
    ("lit", kind, value)           kind: int bigint decimal double string boolean null
    ("fn", name, args, distinct)   function call; ("star",) stands for ``*``
    ("bin", op, left, right)       op: and or = != <=> < <= + - * / % div || & | ^
    ("un", op, operand)            op: not neg ~
    ("is", operand, what, neg)     what: null true false
    ("in", operand, items, neg)    ("between", x, lo, hi, neg)
    ("like", op, x, pattern, neg)  ("case", operand, whens, default)
    ("cast", x, type, try)         ("index", x, i)   ("field", x, name)
    ("lambda", params, body)       ("interval", text)   ("typed", type, text)
    ("opaque", canonical_sql, columns, functions)
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from typing import Any

from compat import ansi as A
from compat import types as T
from compat.errors import ExpressionError

Ast = tuple[Any, ...]

#: Functions that call arbitrary Java code: never allowed in a plan.
FORBIDDEN_FUNCTIONS = frozenset({"reflect", "java_method", "try_reflect"})

#: Functions whose result differs between runs over the same input.
NONDETERMINISTIC_FUNCTIONS = frozenset({
    "rand", "randn", "random", "uuid", "shuffle", "current_timestamp", "now",
    "current_date", "curdate", "localtimestamp", "monotonically_increasing_id",
    "spark_partition_id", "input_file_name", "current_time", "try_aes_decrypt",
})

_FN_ALIASES = {
    "lcase": "lower", "ucase": "upper", "substring": "substr", "len": "length",
    "char_length": "length", "character_length": "length", "mean": "avg",
    "std": "stddev", "stddev_samp": "stddev", "var_samp": "variance", "power": "pow",
    "ceiling": "ceil", "now": "current_timestamp", "day": "dayofmonth", "sha": "sha1",
    "some": "bool_or", "any": "bool_or", "every": "bool_and", "nvl": "ifnull",
    "random": "rand", "curdate": "current_date", "first_value": "first",
    "last_value": "last",
}

_KEYWORDS = frozenset({
    "and", "or", "not", "is", "null", "true", "false", "in", "between", "like", "rlike",
    "ilike", "regexp", "case", "when", "then", "else", "end", "cast", "try_cast", "as",
    "distinct", "interval", "div", "escape", "over", "select", "from",
})

_TOKEN_RE = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?[LlDdSsYy]?(?:BD|bd)?)
  | (?P<str>'(?:[^'\\]|\\.|'')*'|"(?:[^"\\]|\\.|"")*")
  | (?P<qid>`(?:[^`]|``)*`)
  | (?P<id>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op><=>|>>>|<<|>>|->|<=|>=|<>|!=|==|\|\||::|[-+*/%=<>(),.\[\]&|^~!:])
    """,
    re.VERBOSE,
)

# Binding powers for binary operators (higher binds tighter).
_BINARY = {
    "or": 1, "and": 2, "=": 4, "==": 4, "!=": 4, "<>": 4, "<=>": 4, "<": 4, "<=": 4,
    ">": 4, ">=": 4, "|": 5, "^": 6, "&": 7, "<<": 7, ">>": 7, ">>>": 7, "||": 8, "+": 8,
    "-": 8, "*": 9, "/": 9, "%": 9, "div": 9,
}
_NOT_BP = 3  # NOT binds looser than comparisons, tighter than AND
_COMMUTATIVE = {"=", "!=", "<=>", "+", "*", "&", "|", "^"}


@dataclass(frozen=True)
class Token:
    kind: str  # num str id qid op eof
    text: str
    pos: int


def tokenize(text: str) -> list[Token]:
    out: list[Token] = []
    pos = 0
    n = len(text)
    match = _TOKEN_RE.match
    while pos < n:
        m = match(text, pos)
        if m is not None and m.lastgroup == "op" and text.startswith("--", pos):
            raise ExpressionError(f"'--' at column {pos + 1} starts a comment in Spark SQL: "
                                  f"the rest of expression '{text}' would be ignored",
                                  column=pos + 1, expected="an operand (write - -x for a "
                                  "double negation)", found="'--'")
        if m is None:
            raise ExpressionError(f"unexpected character '{text[pos]}' at column {pos + 1} "
                                  f"in expression '{text}'", column=pos + 1)
        kind = m.lastgroup
        if kind != "ws":
            out.append(Token(kind or "op", m.group(), pos))
        pos = m.end()
    out.append(Token("eof", "", n))
    return out


#: how deeply an expression may nest (parentheses, calls, operands of operators): Spark's own
#: parser stops between 300 and 500 nested parentheses, and every function that walks an
#: expression here (typing, canonical form, rendering) recurses once or twice per level
MAX_DEPTH = 256


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = tokenize(text)
        self.i = 0
        self.depth = 0

    # -- helpers --------------------------------------------------------------------------
    def peek(self, k: int = 0) -> Token:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def word(self, k: int = 0) -> str:
        t = self.peek(k)
        return t.text.lower() if t.kind == "id" else ""

    def next(self) -> Token:
        t = self.toks[self.i]
        self.i += 1
        return t

    def fail(self, what: str, tok: Token | None = None) -> ExpressionError:
        tok = tok or self.peek()
        found = f"'{tok.text}'" if tok.kind != "eof" else "end of expression"
        return ExpressionError(
            f"invalid expression '{self.text}': expected {what} at column {tok.pos + 1}, "
            f"found {found}", column=tok.pos + 1)

    def expect_op(self, op: str) -> None:
        t = self.peek()
        if t.kind != "op" or t.text != op:
            raise self.fail(f"'{op}'")
        self.i += 1

    def expect_word(self, w: str) -> None:
        if self.word() != w:
            raise self.fail(w.upper())
        self.i += 1

    # -- grammar --------------------------------------------------------------------------
    def parse(self) -> Ast:
        node = self.expr(0)
        if self.peek().kind != "eof":
            raise self.fail("an operator or the end of the expression")
        return node

    def expr(self, rbp: int) -> Ast:
        left = self.prefix()
        self.depth -= 1  # prefix() counts the levels that are open while it parses
        while True:
            t = self.peek()
            op = t.text.lower() if t.kind in ("op", "id") else ""
            negated = False
            if op == "not" and self.word(1) in ("in", "between", "like", "rlike", "ilike",
                                                 "regexp"):
                if _NOT_BP + 1 <= rbp:
                    break
                self.i += 1
                op = self.word()
                negated = True
            if op in ("in", "between", "like", "rlike", "ilike", "regexp", "is"):
                if 4 <= rbp:
                    break
                self.i += 1
                left = self.postfix_predicate(op, left, negated)
                continue
            bp = _BINARY.get(op)
            if bp is None or bp <= rbp or (t.kind == "id" and op not in ("and", "or", "div")):
                if t.kind == "op" and t.text == "[":
                    self.i += 1
                    idx = self.expr(0)
                    self.expect_op("]")
                    left = ("index", left, idx)
                    continue
                if t.kind == "op" and t.text == "." and self.peek(1).kind in ("id", "qid"):
                    self.i += 1
                    left = ("field", left, _ident(self.next()))
                    continue
                if t.kind == "op" and t.text == "::":
                    self.i += 1
                    left = ("cast", left, self.type_name(), False)
                    continue
                break
            self.i += 1
            right = self.expr(bp)
            left = ("bin", _norm_op(op), left, right)
        return left

    def postfix_predicate(self, op: str, left: Ast, negated: bool) -> Ast:
        if op == "is":
            neg = False
            if self.word() == "not":
                self.i += 1
                neg = True
            w = self.word()
            if w in ("null", "true", "false"):
                self.i += 1
                return ("is", left, w, neg)
            if w == "distinct":
                self.i += 1
                self.expect_word("from")
                right = self.expr(4)
                eq: Ast = ("bin", "<=>", left, right)
                return ("un", "not", eq) if not neg else eq
            raise self.fail("NULL, TRUE, FALSE or DISTINCT FROM after IS")
        if op == "in":
            self.expect_op("(")
            if self.word() == "select":
                raise self.fail("a list of values (subqueries are not allowed)")
            items = [self.expr(0)]
            while self.peek().text == ",":
                self.i += 1
                items.append(self.expr(0))
            self.expect_op(")")
            return ("in", left, tuple(items), negated)
        if op == "between":
            lo = self.expr(4)
            self.expect_word("and")
            hi = self.expr(4)
            return ("between", left, lo, hi, negated)
        pattern = self.expr(4)
        if self.word() == "escape":
            self.i += 1
            self.expr(4)
        return ("like", "rlike" if op == "regexp" else op, left, pattern, negated)

    def prefix(self) -> Ast:
        self.depth += 1
        if self.depth > MAX_DEPTH:  # before Python's own recursion limit is reached
            raise too_deep(self.text, self.peek().pos + 1)
        t = self.next()
        k = t.kind
        if k == "num":
            return _number(t.text)
        if k == "str":
            return ("lit", "string", _unquote(t.text))
        if k == "qid":
            return self.column_rest(_ident(t))
        if k == "op":
            if t.text == "(":
                if self.peek().kind == "id" and self.peek(1).text in (",", ")") and \
                        self._looks_like_lambda():
                    return self.lambda_params()
                inner = self.expr(0)
                if self.peek().text == ",":  # (a, b) is a struct in Spark
                    items = [inner]
                    while self.peek().text == ",":
                        self.i += 1
                        items.append(self.expr(0))
                    self.expect_op(")")
                    return ("fn", "struct", tuple(items), False)
                self.expect_op(")")
                return inner
            if t.text == "-":
                operand = self.expr(10)
                if operand[0] == "lit" and operand[1] in ("int", "bigint", "decimal", "double") \
                        and not operand[2].startswith("-"):  # - -7 stays a negation
                    if operand[1] != "double" and "." not in operand[2]:
                        return _integer("-" + operand[2])  # -2147483648 is an int
                    return ("lit", operand[1], "-" + operand[2])
                if operand[0] == "lit" and operand[1] in ("smallint", "tinyint") and \
                        not operand[2].startswith("-"):
                    return ("lit", operand[1], "-" + operand[2])  # -128Y is a tinyint
                return ("un", "neg", operand)
            if t.text == "+":
                return self.expr(10)
            if t.text in ("~",):
                return ("un", "~", self.expr(10))
            if t.text == "!":
                return ("un", "not", self.expr(_NOT_BP))
            if t.text == "*":
                return ("star",)
            raise self.fail("a value, a column or a function", t)
        if k == "id":
            w = t.text.lower()
            if w == "not":
                return ("un", "not", self.expr(_NOT_BP))
            if w == "null":
                return ("lit", "null", "NULL")
            if w in ("true", "false"):
                return ("lit", "boolean", w.upper())
            if w == "case":
                return self.case()
            if w in ("cast", "try_cast") and self.peek().text == "(":
                self.i += 1
                inner = self.expr(0)
                self.expect_word("as")
                tname = self.type_name()
                self.expect_op(")")
                return ("cast", inner, tname, w == "try_cast")
            if w == "interval":
                return self.interval()
            if w in ("timestamp", "date", "timestamp_ntz", "timestamp_ltz") and \
                    self.peek().kind == "str":
                s = self.next()
                return ("typed", T.parse_type(w), _unquote(s.text))
            if w == "extract" and self.peek().text == "(":
                self.i += 1
                field = self.next().text.lower()
                self.expect_word("from")
                src = self.expr(0)
                self.expect_op(")")
                return ("fn", "extract", (("lit", "string", field), src), False)
            if w in ("current_timestamp", "current_date", "localtimestamp",
                     "current_user", "current_timezone") and self.peek().text != "(":
                return ("fn", _FN_ALIASES.get(w, w), (), False)
            if self.peek().kind == "op" and self.peek().text == "(":
                return self.call(w)
            if self.peek().text == "->":  # x -> x + 1
                self.i += 1
                return ("lambda", (w,), self.expr(0))
            if w in _KEYWORDS:
                raise self.fail("a value, a column or a function", t)
            return self.column_rest(_ident(t))
        raise self.fail("a value, a column or a function", t)

    def _looks_like_lambda(self) -> bool:
        j = self.i
        while j < len(self.toks) and self.toks[j].text != ")":
            if self.toks[j].kind not in ("id", "op") or \
                    (self.toks[j].kind == "op" and self.toks[j].text != ","):
                return False
            j += 1
        return j + 1 < len(self.toks) and self.toks[j + 1].text == "->"

    def lambda_params(self) -> Ast:
        params = []
        while self.peek().text != ")":
            params.append(_ident(self.next()))
            if self.peek().text == ",":
                self.i += 1
        self.expect_op(")")
        self.expect_op("->")
        return ("lambda", tuple(params), self.expr(0))

    def column_rest(self, first: str) -> Ast:
        parts = [first]
        while self.peek().text == "." and self.peek(1).kind in ("id", "qid"):
            self.i += 1
            parts.append(_ident(self.next()))
        return ("col", tuple(parts))

    def call(self, name: str) -> Ast:
        self.expect_op("(")
        name = _FN_ALIASES.get(name, name)
        distinct = False
        args: list[Ast] = []
        if self.word() == "distinct":
            self.i += 1
            distinct = True
        elif self.word() == "all":
            self.i += 1
        if self.peek().text != ")":
            args.append(self.expr(0))
            while self.peek().text == ",":
                self.i += 1
                args.append(self.expr(0))
        self.expect_op(")")
        if self.word() in ("over", "filter", "within"):
            raise self.fail("no window or FILTER clause (use a top_n or aggregate step)")
        return ("fn", name, tuple(args), distinct)

    def case(self) -> Ast:
        operand = None
        if self.word() != "when":
            operand = self.expr(0)
        whens = []
        while self.word() == "when":
            self.i += 1
            cond = self.expr(0)
            self.expect_word("then")
            whens.append((cond, self.expr(0)))
        if not whens:
            raise self.fail("WHEN")
        default = None
        if self.word() == "else":
            self.i += 1
            default = self.expr(0)
        self.expect_word("end")
        return ("case", operand, tuple(whens), default)

    def interval(self) -> Ast:
        parts = []
        while True:
            t = self.peek()
            if t.kind in ("num", "str"):
                parts.append(_unquote(t.text) if t.kind == "str" else t.text)
                self.i += 1
                if self.peek().kind == "id" and self.word() not in _KEYWORDS:
                    parts.append(self.next().text.lower())
                continue
            if t.kind == "op" and t.text == "-" and self.peek(1).kind == "num":
                self.i += 1
                continue
            break
        if not parts:
            raise self.fail("an interval value such as '5 minutes'")
        return ("interval", " ".join(parts).lower())

    def type_name(self) -> str:
        start = self.peek().pos
        depth = 0
        end = start
        while True:
            t = self.peek()
            if t.kind == "eof":
                break
            if t.text in ("<", "("):
                depth += 1
            elif t.text in (">", ")"):
                if depth == 0:
                    break
                depth -= 1
            elif t.text == "," and depth == 0:
                break
            elif t.kind == "id" and depth == 0 and end > start and \
                    self.toks[self.i - 1].kind == "id":
                break
            self.i += 1
            end = t.pos + len(t.text)
        try:
            return T.parse_type(self.text[start:end])
        except T.TypeSyntaxError as e:
            raise ExpressionError(f"invalid expression '{self.text}': {e}",
                                  column=start + 1) from None


def _ident(t: Token) -> str:
    if t.kind == "qid":
        return t.text[1:-1].replace("``", "`").lower()
    return t.text.lower()


def _unquote(s: str) -> str:
    q = s[0]
    body = s[1:-1].replace(q + q, q)
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), body)


#: the largest value of each integer literal suffix (a leading '-' may reach one more)
_SUFFIX_MAX = {"y": ("tinyint", 2**7), "s": ("smallint", 2**15), "l": ("bigint", 2**63)}
_SUFFIX_RANGE = {kind: limit for kind, limit in _SUFFIX_MAX.values()}
_SUFFIX = {kind: suffix.upper() for suffix, (kind, _) in _SUFFIX_MAX.items()}


def _number(text: str) -> Ast:
    """A numeric literal, typed as Spark types it; one Spark refuses (beyond its type's
    range or 38 digits of precision) is refused here, before Python converts it."""
    t = text.lower()
    if t.endswith("bd"):
        if not re.fullmatch(r"(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?", t[:-2]):
            raise ExpressionError(f"invalid number literal {text}", expected="digits "
                                  "before the BD suffix", found=text)
        _precision(t[:-2].partition("e")[0], text)
        return ("lit", "decimal", t[:-2])
    if t[-1] in _SUFFIX_MAX:
        kind, limit = _SUFFIX_MAX[t[-1]]
        digits = t[:-1]
        if not digits.isdigit():
            raise ExpressionError(f"invalid number literal {text}", expected="digits "
                                  f"before the {t[-1].upper()} suffix", found=text)
        if len(digits.lstrip("0")) > 19 or int(digits) > limit:
            raise _out_of_range(text, f"a {kind} (at most {limit - 1})")
        return ("lit", kind, digits)
    if t.endswith("d") or "e" in t:
        value = float(t[:-1] if t.endswith("d") else t)
        if value == float("inf"):
            raise _out_of_range(text, "a double (at most about 1.8e308)")
        return ("lit", "double", repr(value))
    if "." in t:
        _precision(t, text)
        whole, _, frac = t.partition(".")
        return ("lit", "decimal", (whole.lstrip("0") or "0") + "." + (frac or "0"))
    _precision(t, text)
    return _integer(t)


def _integer(t: str) -> Ast:
    """An integer literal: an int, else a bigint, else a decimal (up to 38 digits)."""
    v = int(t)
    if -2**31 <= v < 2**31:
        return ("lit", "int", str(v))
    if -2**63 <= v < 2**63:
        return ("lit", "bigint", str(v))
    return ("lit", "decimal", str(v))


def _precision(t: str, text: str) -> None:
    whole, _, frac = t.lstrip("-").partition(".")
    digits = len(whole.lstrip("0")) + len(frac)
    if digits > T.MAX_PRECISION:
        raise _out_of_range(text, f"at most {T.MAX_PRECISION} digits (Spark's decimal "
                            "precision)", found=f"{digits} digits")


def _out_of_range(text: str, expected: str, found: str | None = None) -> ExpressionError:
    shown = text if len(text) <= 24 else text[:20] + "..."
    return ExpressionError(f"number literal {shown} is out of range", expected=expected,
                           found=found or shown)


def too_deep(text: str, column: int | None = None, depth: int | None = None
             ) -> ExpressionError:
    shown = text if len(text) <= 60 else text[:56] + "..."
    return ExpressionError(
        f"expression '{shown}' is nested too deeply", column=column,
        expected=f"at most {MAX_DEPTH} levels of parentheses, calls and operators",
        found=f"{depth} levels" if depth else f"more than {MAX_DEPTH}",
        hint="A long chain of OR or + nests one level per operator: write `x IN (a, b, ...)` "
             "or split the expression over several steps")


def _norm_op(op: str) -> str:
    return {"==": "=", "<>": "!=", "regexp": "rlike"}.get(op, op)


# ---------------------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------------------

_PARSE_CACHE: dict[str, Ast] = {}
_SHAPE_CACHE: dict[str, Ast] = {}
_LITERAL_RE = re.compile(r"'(?:[^'\\]|\\.|'')*'|(?<![\w.`])\d+(?![\w.])")
_STRING_RE = re.compile(r"'(?:[^'\\]|\\.|'')*'")
#: a whole run of digits as ``_LITERAL_RE`` finds one, of fewer than 10 digits (longer
#: numbers keep their value: it may not fit an int)
_NUMBER_RE = re.compile(r"(?<![\w.`])\d{1,9}(?![\w.])")


def shape(text: str) -> Ast:
    """Parse ``text`` with its plain literals replaced by placeholders of the same kind.

    Validation (syntax, columns, functions, types) does not depend on literal values, so
    expressions that differ only in constants share one parse: large generated plans repeat
    a few expression shapes thousands of times.
    """
    # As ``_LITERAL_RE.sub(_placeholder, text)`` (a test says so), in two passes of C
    # with no Python call per literal: string literals, then the numbers left outside them
    # (a number never holds a quote, and a placeholder keeps the quotes around it).
    key = _NUMBER_RE.sub("1", _STRING_RE.sub("'s'", text))
    ast = _SHAPE_CACHE.get(key)
    if ast is None:
        low = key.lower()
        if key != text and ("interval" in low or "decimal" in low or "named_struct" in low):
            key = text  # literal values matter to validity here (field names, precision)
        try:
            ast = parse(key)
        except ExpressionError:
            parse(text)  # the error message must point into the user's own text
            raise
        _SHAPE_CACHE[key] = ast
    return ast


def _placeholder(m: re.Match[str]) -> str:
    s = m.group()
    if s[0] == "'":
        return "'s'"
    return "1" if len(s) < 10 else s


def parse(text: str) -> Ast:
    """Parse a Spark SQL expression string into the tuple AST (cached per string)."""
    cached = _PARSE_CACHE.get(text)
    if cached is not None:
        return cached
    if not isinstance(text, str) or not text.strip():
        raise ExpressionError("empty expression", column=1)
    parser = _Parser(text)
    try:
        ast = parser.parse()
        depth = _depth(ast)
        if depth > MAX_DEPTH:  # a long chain of operators is parsed in a loop, not nested
            raise too_deep(text, depth=depth)
    except ExpressionError as own:
        if parser.depth > MAX_DEPTH or "nested too deeply" in own.message:
            raise
        # Only a word we do not know (TRIM(BOTH ... FROM ...), POSITION(a IN b), ...) can
        # be valid Spark outside our subset; a misplaced operator or bracket never is.
        toks = parser.toks
        i = min(parser.i, len(toks) - 1)
        near = {toks[j].kind for j in (i - 1, i) if 0 <= j < len(toks)}
        if "id" not in near:
            raise
        ast = _sqlglot_fallback(text, own)
    _check_functions(ast, text)
    _PARSE_CACHE[text] = ast
    return ast


def _sqlglot_fallback(text: str, own: ExpressionError) -> Ast:
    """Second opinion from sqlglot's Spark dialect for syntax outside our subset."""
    try:
        import sqlglot
        from sqlglot import exp
    except ImportError:  # pragma: no cover - sqlglot is a dependency
        raise own from None
    try:
        tree = sqlglot.parse_one(text, read="spark", into=exp.Condition)
    except Exception:
        raise own from None
    if isinstance(tree, (exp.Select, exp.Subquery, exp.Query, exp.Alias)) or \
            tree.find(exp.Select, exp.Window, exp.Subquery, exp.Alias) is not None:
        raise own
    cols = tuple(sorted({tuple(p.lower() for p in c.sql(dialect="spark").replace("`", "")
                                 .split(".")) for c in tree.find_all(exp.Column)}))
    fns = tuple(sorted({(f.sql_name() if not isinstance(f, exp.Anonymous) else f.name).lower()
                        for f in tree.find_all(exp.Func)}))
    # sqlglot names the functions it knows its own way (POSITION is STR_POSITION): only a
    # function it does not know (Anonymous) is looked up in Spark's list.
    for f in tree.find_all(exp.Anonymous):
        if f.name.lower() not in spark_functions():
            raise unknown_function(f.name.lower(), text)
    canon = tree.sql(dialect="spark", normalize=True, identify=False)
    return ("opaque", canon, cols, fns)


def _depth(ast: Ast) -> int:
    """How deeply ``ast`` nests (iteratively: it may be deeper than Python recursion)."""
    deepest = 0
    stack = [(ast, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        for part in node[1:]:
            if isinstance(part, tuple) and part:
                if isinstance(part[0], str) and part[0] in _TAGS:
                    stack.append((part, d + 1))
                else:
                    for sub in part:
                        if isinstance(sub, tuple) and sub and isinstance(sub[0], str) \
                                and sub[0] in _TAGS:
                            stack.append((sub, d + 1))
                        elif isinstance(sub, tuple):  # CASE (cond, value) pairs
                            stack.extend((x, d + 1) for x in sub if isinstance(x, tuple)
                                         and x and x[0] in _TAGS)
    return deepest


def walk(ast: Ast):
    """Yield every sub-tree of ``ast`` (pre-order)."""
    stack = [ast]
    while stack:
        node = stack.pop()
        yield node
        if node[0] in _NAMES:
            # a column's or star's name path is names, not sub-trees: a table called `fn`
            # or `col` would otherwise be read as a call or a column
            continue
        for part in node[1:]:
            if isinstance(part, tuple) and part:
                if isinstance(part[0], str) and part[0] in _TAGS:
                    stack.append(part)
                else:
                    for sub in part:
                        if isinstance(sub, tuple) and sub and isinstance(sub[0], str) \
                                and sub[0] in _TAGS:
                            stack.append(sub)
                        elif isinstance(sub, tuple):  # CASE (cond, value) pairs
                            stack.extend(x for x in sub if isinstance(x, tuple) and x
                                         and x[0] in _TAGS)


_NAMES = frozenset({"col", "star"})
_TAGS = frozenset({"col", "lit", "fn", "star", "bin", "un", "is", "in", "between", "like",
                   "case", "cast", "index", "field", "lambda", "interval", "typed", "opaque"})


def functions(ast: Ast) -> set[str]:
    out = set()
    for node in walk(ast):
        if node[0] == "fn":
            out.add(node[1])
        elif node[0] == "opaque":
            out.update(node[3])
    return out


def _check_functions(ast: Ast, text: str) -> None:
    used = functions(ast)
    bad = used & FORBIDDEN_FUNCTIONS
    if bad:
        name = sorted(bad)[0]
        raise ExpressionError(
            f"expression '{text}' calls {name}(), which runs arbitrary Java code and is "
            f"refused in plans", expected="Spark SQL built-in functions", found=f"{name}()")
    known = spark_functions()
    unknown = sorted(n for n in used if n not in known)
    if unknown and ast[0] != "opaque":
        raise unknown_function(unknown[0], text)


def unknown_function(name: str, text: str) -> ExpressionError:
    """A function Spark does not have: a user-defined function is not part of a plan (the
    query is rebuilt from the plan alone), and a typo would only fail when it starts."""
    import difflib

    close = difflib.get_close_matches(name, sorted(spark_functions()), n=1, cutoff=0.6)
    return ExpressionError(
        f"unknown function '{name}' in expression '{text}'",
        expected=f"a built-in function of Spark {spark_functions_version()}",
        found=f"{name}()", hint=f"Did you mean '{close[0]}'?" if close else None)


@cache
def _spark_functions_doc() -> dict[str, Any]:
    from importlib import resources

    doc = resources.files("compat").joinpath("spark_functions.json").read_text(encoding="utf-8")
    return json.loads(doc)


@cache
def spark_functions() -> frozenset[str]:
    """Spark's built-in function names (``compat/spark_functions.json``, generated from
    PySpark by ``scripts/gen_spark_functions.py``)."""
    return frozenset(_spark_functions_doc()["functions"])


def spark_functions_version() -> str:
    return str(_spark_functions_doc()["spark_version"])


def columns(ast: Ast) -> set[tuple[str, ...]]:
    """Column references (lower-cased parts), excluding lambda parameters."""
    out: set[tuple[str, ...]] = set()
    _columns(ast, frozenset(), out)
    return out


def _columns(ast: Ast, bound: frozenset[str], out: set[tuple[str, ...]]) -> None:
    tag = ast[0]
    if tag == "col":
        if ast[1][0] not in bound:
            out.add(ast[1])
        return
    if tag == "lambda":
        _columns(ast[2], bound | set(ast[1]), out)
        return
    if tag == "opaque":
        out.update(ast[2])
        return
    for part in ast[1:]:
        if isinstance(part, tuple) and part:
            if isinstance(part[0], str) and part[0] in _TAGS:
                _columns(part, bound, out)
            else:
                for sub in part:
                    if isinstance(sub, tuple) and sub:
                        if isinstance(sub[0], str) and sub[0] in _TAGS:
                            _columns(sub, bound, out)
                        else:
                            for x in sub:
                                if isinstance(x, tuple) and x and x[0] in _TAGS:
                                    _columns(x, bound, out)


def conjuncts(text: str) -> list[str]:
    """The conjuncts of a condition, each as text: ``a AND (b AND c)`` gives ``a``, ``b``
    and ``c``, in the order written."""
    out: list[str] = []
    todo = [parse(text)]
    while todo:
        a = todo.pop()
        if a[0] == "bin" and a[1] == "and":
            todo += [a[3], a[2]]
        else:
            out.append(render(a))
    return out


def substitute(text: str, exprs: dict[str, str]) -> str:
    """``text`` with every column named in ``exprs`` (lower-case, the first part of a
    reference) replaced by that expression; a field of it stays a field (``a.f``)."""
    repl = {k: parse(v) for k, v in exprs.items()}

    def sub(ast: Ast, bound: frozenset[str]) -> Ast:
        tag = ast[0]
        if tag == "col":
            parts = ast[1]
            if parts[0] in bound or parts[0] not in repl:
                return ast
            out = repl[parts[0]]
            for f in parts[1:]:
                out = ("field", out, f)
            return out
        if tag == "lambda":
            return ("lambda", ast[1], sub(ast[2], bound | frozenset(ast[1])))
        return tuple(sub_part(p, bound) for p in ast)

    def sub_part(part: Any, bound: frozenset[str]) -> Any:
        if isinstance(part, tuple) and part:
            if isinstance(part[0], str):
                return sub(part, bound) if part[0] in _TAGS else part
            return tuple(sub_part(p, bound) for p in part)
        return part

    return render(sub(parse(text), frozenset()))


#: functions that return null when an argument is null (Spark's NullIntolerant ones met in
#: filters); any other function is taken as able to turn a null into a value
_NULL_INTOLERANT = frozenset({
    "abs", "upper", "lower", "ucase", "lcase", "length", "char_length", "trim", "ltrim",
    "rtrim", "substring", "substr", "round", "floor", "ceil", "ceiling", "year", "month",
    "day", "dayofmonth", "hour", "minute", "second", "to_date", "date_trunc", "sqrt", "exp",
    "ln", "log10", "sign", "signum", "size", "lpad", "rpad", "reverse", "initcap"})
_COMPARISONS = frozenset({"=", "==", "!=", "<>", "<", ">", "<=", ">="})
_ARITHMETIC = frozenset({"+", "-", "*", "/", "%", "div", "||", "&", "|", "^"})


def rejects_nulls(text: str) -> bool:
    """The condition is null or false when every column it reads is null (Spark's
    ``canFilterOutNull``): a filter of it drops the null-padded rows of an outer join, which
    is why Spark's optimizer turns such a join into an inner one (``EliminateOuterJoin``).
    Where a function could turn a null into a value, it is taken as not rejecting."""
    ast = parse(text)
    if not is_deterministic(ast):
        return False
    return _null_eval(ast) in (None, False)


_VALUE = "value"  # some non-null value
_UNKNOWN = "unknown"  # cannot tell without the data


def _null_eval(ast: Ast) -> Any:
    """The value of ``ast`` with every column null: None (null), True, False, _VALUE or
    _UNKNOWN (three-valued logic where it can tell)."""
    tag = ast[0]
    if tag == "col":
        return None
    if tag == "lit":
        if ast[1] == "boolean":
            return str(ast[2]).upper() == "TRUE"
        return None if ast[1] in ("null", "void") else _VALUE
    if tag == "bin":
        op, a, b = ast[1], _null_eval(ast[2]), _null_eval(ast[3])
        if op == "and":
            if a is False or b is False:
                return False
            if a is True and b is True:
                return True
            return None if None in (a, b) and _UNKNOWN not in (a, b) else _UNKNOWN
        if op == "or":
            if a is True or b is True:
                return True
            if a is False and b is False:
                return False
            return None if None in (a, b) and _UNKNOWN not in (a, b) else _UNKNOWN
        if op in _COMPARISONS or op in _ARITHMETIC:
            return None if None in (a, b) else _UNKNOWN
        return _UNKNOWN
    if tag == "un":
        v = _null_eval(ast[2])
        if ast[1] == "not":
            return (not v) if isinstance(v, bool) else v
        return None if v is None else _UNKNOWN
    if tag == "is" and ast[2] == "null":
        v = _null_eval(ast[1])
        if v is None:
            return not ast[3]
        return ast[3] if v in (True, False, _VALUE) else _UNKNOWN
    if tag in ("in", "between", "like", "cast", "field", "index"):
        v = _null_eval(ast[2] if tag == "like" else ast[1])
        return None if v is None else _UNKNOWN
    if tag == "fn" and ast[1] in _NULL_INTOLERANT:
        args = [_null_eval(a) for a in ast[2]]
        return None if None in args else _UNKNOWN
    return _UNKNOWN


def is_deterministic(ast: Ast) -> bool:
    return not (functions(ast) & NONDETERMINISTIC_FUNCTIONS)


# ---------------------------------------------------------------------------------------
# Canonical form
# ---------------------------------------------------------------------------------------

_CANON_CACHE: dict[str, str] = {}


def canonical(text: str) -> str:
    """Canonical text of an expression: equal for expressions Spark computes identically.

    Case of identifiers and keywords, whitespace, redundant parentheses, operand order of
    commutative operators, ``a > b`` versus ``b < a`` and function aliases do not matter.
    """
    cached = _CANON_CACHE.get(text)
    if cached is None:
        cached = render(normalize(parse(text)))
        _CANON_CACHE[text] = cached
    return cached


def normalize(ast: Ast) -> Ast:
    tag = ast[0]
    if tag == "bin":
        op, left, right = ast[1], normalize(ast[2]), normalize(ast[3])
        if op in (">", ">="):
            op, left, right = ("<" if op == ">" else "<="), right, left
        if op in ("and", "or"):
            items = _flatten(op, left) + _flatten(op, right)
            items.sort(key=render)
            out = items[0]
            for item in items[1:]:
                out = ("bin", op, out, item)
            return out
        if op in _COMMUTATIVE and render(right) < render(left):
            left, right = right, left
        return ("bin", op, left, right)
    if tag == "un":
        inner = normalize(ast[2])
        if ast[1] == "not" and inner[0] == "un" and inner[1] == "not":
            return inner[2]
        if ast[1] == "not" and inner[0] == "bin" and inner[1] == "=":
            # Spark's analyzer writes a <> b as NOT (a = b): the same three-valued logic
            return normalize(("bin", "!=", inner[2], inner[3]))
        return ("un", ast[1], inner)
    if tag == "fn":
        return ("fn", ast[1], tuple(normalize(a) for a in ast[2]), ast[3])
    if tag == "in":
        items = sorted((normalize(i) for i in ast[2]), key=render)
        return ("in", normalize(ast[1]), tuple(items), ast[3])
    if tag == "between":
        return ("between", normalize(ast[1]), normalize(ast[2]), normalize(ast[3]), ast[4])
    if tag == "like":
        return ("like", ast[1], normalize(ast[2]), normalize(ast[3]), ast[4])
    if tag == "is":
        return ("is", normalize(ast[1]), ast[2], ast[3])
    if tag == "case":
        return ("case", normalize(ast[1]) if ast[1] else None,
                tuple((normalize(c), normalize(v)) for c, v in ast[2]),
                normalize(ast[3]) if ast[3] else None)
    if tag == "cast":
        return ("cast", normalize(ast[1]), ast[2], ast[3])
    if tag == "index":
        return ("index", normalize(ast[1]), normalize(ast[2]))
    if tag == "field":
        inner = normalize(ast[1])
        if inner[0] == "col":
            return ("col", inner[1] + (ast[2],))
        return ("field", inner, ast[2])
    if tag == "lambda":
        return ("lambda", ast[1], normalize(ast[2]))
    if tag == "interval":
        return ("interval", _interval_canonical(ast[1]))
    return ast


#: interval units, singular: ``INTERVAL 10 MINUTES`` is ``INTERVAL '10' MINUTE``
_UNITS = {"year", "month", "week", "day", "hour", "minute", "second", "millisecond",
          "microsecond"}


def _interval_canonical(text: str) -> str:
    """An interval's text with units in the singular and numbers without leading zeros
    (Spark writes ``INTERVAL '01' HOUR`` for what users write ``INTERVAL 1 HOURS``)."""
    out = []
    for word in text.split():
        if word.endswith("s") and word[:-1] in _UNITS:
            word = word[:-1]
        elif word.isdigit():
            word = str(int(word))
        out.append(word)
    return " ".join(out)


def _flatten(op: str, ast: Ast) -> list[Ast]:
    if ast[0] == "bin" and ast[1] == op:
        return _flatten(op, ast[2]) + _flatten(op, ast[3])
    return [ast]


def render(ast: Ast) -> str:
    """Render an AST back to Spark SQL (fully parenthesised, lower-case identifiers)."""
    tag = ast[0]
    if tag == "col":
        return ".".join(_quote_ident(p) for p in ast[1])
    if tag == "lit":
        kind, value = ast[1], ast[2]
        if kind == "string":
            return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
        if kind == "bigint":
            return value + "L"
        if kind == "double":
            return value + "D"
        if kind in ("smallint", "tinyint"):
            return value + ("S" if kind == "smallint" else "Y")
        return value
    if tag == "fn":
        inner = ", ".join(render(a) for a in ast[2])
        return f"{ast[1]}({'DISTINCT ' if ast[3] else ''}{inner})"
    if tag == "star":
        return "*"
    if tag == "bin":
        op = ast[1].upper() if ast[1] in ("and", "or", "div") else ast[1]
        return f"({render(ast[2])} {op} {render(ast[3])})"
    if tag == "un":
        if ast[1] == "not":
            return f"(NOT {render(ast[2])})"
        inner = render(ast[2])
        op = "-" if ast[1] == "neg" else ast[1]
        # "--" starts a comment in Spark SQL: - -7 keeps its space
        return f"({op}{' ' if inner.startswith('-') else ''}{inner})"
    if tag == "is":
        return f"({render(ast[1])} IS {'NOT ' if ast[3] else ''}{ast[2].upper()})"
    if tag == "in":
        items = ", ".join(render(i) for i in ast[2])
        return f"({render(ast[1])} {'NOT ' if ast[3] else ''}IN ({items}))"
    if tag == "between":
        return (f"({render(ast[1])} {'NOT ' if ast[4] else ''}BETWEEN {render(ast[2])} "
                f"AND {render(ast[3])})")
    if tag == "like":
        return f"({render(ast[2])} {'NOT ' if ast[4] else ''}{ast[1].upper()} {render(ast[3])})"
    if tag == "case":
        out = "CASE"
        if ast[1] is not None:
            out += " " + render(ast[1])
        for c, v in ast[2]:
            out += f" WHEN {render(c)} THEN {render(v)}"
        if ast[3] is not None:
            out += f" ELSE {render(ast[3])}"
        return out + " END"
    if tag == "cast":
        return f"{'TRY_CAST' if ast[3] else 'CAST'}({render(ast[1])} AS {ast[2]})"
    if tag == "index":
        return f"{render(ast[1])}[{render(ast[2])}]"
    if tag == "field":
        return f"{render(ast[1])}.{_quote_ident(ast[2])}"
    if tag == "lambda":
        params = ast[1][0] if len(ast[1]) == 1 else "(" + ", ".join(ast[1]) + ")"
        return f"{params} -> {render(ast[2])}"
    if tag == "interval":
        return f"INTERVAL '{ast[1]}'"
    if tag == "typed":
        return f"{ast[1].upper()} '{ast[2]}'"
    if tag == "opaque":
        return ast[1]
    raise AssertionError(f"unknown AST tag {tag}")


def _quote_ident(name: str) -> str:
    if re.fullmatch(r"[a-z_][a-z0-9_]*", name) and name not in _KEYWORDS:
        return name
    return "`" + name.replace("`", "``") + "`"


# ---------------------------------------------------------------------------------------
# Types
# ---------------------------------------------------------------------------------------


class Scope:
    """Columns visible to an expression: unqualified names and names under a qualifier."""

    __slots__ = ("columns", "qualified")

    def __init__(self, columns: dict[str, str],
                 qualified: dict[str, dict[str, str]] | None = None) -> None:
        self.columns = columns
        self.qualified = qualified or {}

    def resolve(self, parts: tuple[str, ...]) -> str | None:
        """Type of a column reference, or None when it does not resolve."""
        if parts[0] in self.qualified and len(parts) > 1:
            t = self.qualified[parts[0]].get(parts[1])
            rest = parts[2:]
        else:
            t = self.columns.get(parts[0])
            rest = parts[1:]
        if t is None:
            return None
        for field in rest:
            if t == T.UNKNOWN:
                return t
            if t.startswith("map<string,"):  # m.k is m['k'] in Spark
                t = T.map_kv(t)[1]
                continue
            fields = dict(T.struct_fields(t))
            if field not in fields:
                return None
            t = fields[field]
        return t


_AGG_FUNCTIONS = frozenset({
    "count", "sum", "avg", "min", "max", "first", "last", "any_value", "collect_list",
    "collect_set", "stddev", "stddev_pop", "variance", "var_pop", "bool_and", "bool_or",
    "approx_count_distinct", "count_if", "max_by", "min_by", "percentile_approx",
    "approx_percentile", "median", "mode", "count_min_sketch", "corr", "covar_pop",
    "covar_samp", "skewness", "kurtosis", "array_agg", "bit_and", "bit_or",
    "bit_xor", "string_agg", "listagg", "hll_sketch_agg",
})
AGGREGATE_FUNCTIONS = _AGG_FUNCTIONS

_STRING_FNS = frozenset({
    "upper", "lower", "trim", "ltrim", "rtrim", "concat", "concat_ws", "substr", "replace",
    "regexp_replace", "regexp_extract", "lpad", "rpad", "initcap", "format_string", "sha1",
    "sha2", "md5", "hex", "base64", "uuid", "date_format", "to_json", "string", "translate",
    "repeat", "left", "right", "split_part", "format_number", "soundex", "reverse",
    "from_unixtime", "current_user", "current_timezone", "typeof", "chr", "char", "btrim",
    "overlay", "printf", "url_encode", "url_decode", "substring_index",
})
_INT_FNS = frozenset({
    "length", "size", "instr", "locate", "year", "month", "dayofmonth", "hour", "minute",
    "second", "dayofweek", "dayofyear", "weekofyear", "quarter", "datediff", "ascii",
    "bit_length", "octet_length", "spark_partition_id", "array_size", "hash",
    "cardinality", "levenshtein", "find_in_set", "extract", "date_part", "position",
})
_DOUBLE_FNS = frozenset({
    "sqrt", "exp", "log", "ln", "log10", "log2", "pow", "rand", "randn", "stddev",
    "stddev_pop", "variance", "var_pop", "sin", "cos", "tan", "asin", "acos", "atan",
    "atan2", "degrees", "radians", "cbrt", "corr", "covar_pop", "covar_samp", "skewness",
    "kurtosis", "percent_rank", "double", "e", "pi", "median", "percentile_approx",
    "approx_percentile", "try_divide", "signum", "sign",
})
_BOOL_FNS = frozenset({
    "array_contains", "isnull", "isnotnull", "bool_and", "bool_or", "startswith",
    "endswith", "contains", "exists", "forall", "isnan", "rlike", "like", "ilike",
    "arrays_overlap", "map_contains_key", "boolean", "equal_null",
})
_BIGINT_FNS = frozenset({"count", "count_if", "approx_count_distinct",
                         "monotonically_increasing_id", "unix_timestamp", "xxhash64",
                         "bigint", "unix_seconds", "unix_millis", "unix_micros"})
_ARG_FNS = frozenset({"min", "max", "first", "last", "any_value", "abs", "negative",
                      "positive", "mode", "max_by", "min_by"})
_WIDER_FNS = frozenset({"coalesce", "ifnull", "greatest", "least", "nullif", "nvl2"})
_TS_FNS = frozenset({"current_timestamp", "to_timestamp", "timestamp_seconds",
                     "timestamp_millis", "timestamp_micros", "localtimestamp",
                     "date_trunc", "from_utc_timestamp", "to_utc_timestamp", "timestamp",
                     "make_timestamp", "window_time"})
_DATE_FNS = frozenset({"current_date", "to_date", "date_add", "date_sub", "add_months",
                       "last_day", "next_day", "date", "make_date", "trunc"})


def infer_type(ast: Ast, scope: Scope) -> str:
    """Best-effort Spark result type of ``ast``; unknown columns raise ExpressionError."""
    tag = ast[0]
    if tag == "col":
        t = scope.resolve(ast[1])
        if t is None:
            raise _unknown_column(ast[1], scope)
        return t
    if tag == "lit":
        kind = ast[1]
        if kind == "decimal":
            whole, _, frac = ast[2].lstrip("-").partition(".")
            return f"decimal({max(len(whole) + len(frac), 1)},{len(frac)})"
        if kind in _SUFFIX_RANGE and int(ast[2]) >= _SUFFIX_RANGE[kind]:
            # 128Y: read up to the limit so that -128Y parses; only negated may it reach it
            raise _out_of_range(ast[2] + _SUFFIX[kind], f"a {kind} (at most "
                                f"{_SUFFIX_RANGE[kind] - 1})")
        return "void" if kind == "null" else kind
    if tag == "bin":
        op = ast[1]
        lt, rt = infer_type(ast[2], scope), infer_type(ast[3], scope)
        _ansi(ast, A.binary(op, lt, rt))
        if op in ("and", "or", "=", "!=", "<=>", "<", "<=", ">", ">="):
            return "boolean"
        if op == "||":
            return "string" if not lt.startswith("array<") else lt
        if op == "div":
            return "bigint"
        if op == "/":
            if lt.startswith("decimal(") and rt.startswith("decimal("):
                return "decimal(38,6)"
            return "double"
        if lt in ("timestamp", "date") and rt in ("interval", "int", T.UNKNOWN):
            return lt
        if lt == "string" or rt == "string":
            return "double"
        return T.wider(lt, rt)
    if tag == "un":
        t = infer_type(ast[2], scope)
        _ansi(ast, A.unary(ast[1], t))
        return "boolean" if ast[1] == "not" else t
    if tag == "is":
        t = infer_type(ast[1], scope)
        if ast[2] != "null":
            _ansi(ast, A.is_truth(t))
        return "boolean"
    if tag == "in":
        types = [infer_type(ast[1], scope)] + [infer_type(x, scope) for x in ast[2]]
        _ansi(ast, A.all_common(types, "IN", compare=True))
        return "boolean"
    if tag == "between":
        x, lo, hi = (infer_type(a, scope) for a in ast[1:4])
        _ansi(ast, A.all_common([x, lo], "BETWEEN", compare=True) or
              A.all_common([x, hi], "BETWEEN", compare=True))
        return "boolean"
    if tag == "like":
        for sub in ast[1:]:
            if isinstance(sub, tuple) and sub and isinstance(sub[0], str) and sub[0] in _TAGS:
                infer_type(sub, scope)
            elif isinstance(sub, tuple):
                for x in sub:
                    infer_type(x, scope)
        return "boolean"
    if tag == "case":
        operand = infer_type(ast[1], scope) if ast[1] is not None else None
        result = "void"
        results = []
        for cond, value in ast[2]:
            ct = infer_type(cond, scope)
            if operand is not None:
                _ansi(ast, A.all_common([operand, ct], "CASE ... WHEN", compare=True))
            else:
                _ansi(ast, A.condition(ct, "a WHEN clause"))
            results.append(infer_type(value, scope))
        if ast[3] is not None:
            results.append(infer_type(ast[3], scope))
        _ansi(ast, A.all_common(results, "CASE"))
        for t in results:
            result = T.wider(result, t)
        return result
    if tag == "cast":
        _ansi(ast, A.cast(infer_type(ast[1], scope), ast[2]))
        return ast[2]
    if tag == "index":
        base = infer_type(ast[1], scope)
        _ansi(ast, A.index(base, infer_type(ast[2], scope)))
        if base.startswith("array<"):
            return T.array_element(base)
        if base.startswith("map<"):
            return T.map_kv(base)[1]
        return T.UNKNOWN
    if tag == "field":
        base = infer_type(ast[1], scope)
        _ansi(ast, A.field(base, ast[2]))
        return dict(T.struct_fields(base)).get(ast[2], T.UNKNOWN)
    if tag == "interval":
        return "interval"
    if tag == "typed":
        return ast[1]
    if tag == "star":
        return T.UNKNOWN
    if tag == "lambda":
        return T.UNKNOWN
    if tag == "opaque":
        for parts in ast[2]:
            if scope.resolve(parts) is None and parts[0] not in scope.qualified:
                raise _unknown_column(parts, scope)
        return T.UNKNOWN
    if tag == "fn":
        return _function_type(ast, scope)
    return T.UNKNOWN


def _function_type(ast: Ast, scope: Scope) -> str:
    name, args = ast[1], ast[2]
    lambdas = False
    arg_types = []
    for a in args:  # a loop, not a comprehension: one frame less per nested call
        if a[0] == "lambda":
            lambdas = True
            arg_types.append(T.UNKNOWN)
        else:
            arg_types.append(infer_type(a, scope))
    first = arg_types[0] if arg_types else T.UNKNOWN
    _ansi(ast, A.call(name, arg_types))
    if lambdas:
        if name in ("filter",):
            return first
        if name in ("exists", "forall"):
            return "boolean"
        return T.UNKNOWN
    if name in _BIGINT_FNS:
        return "bigint"
    if name == "sum":
        if first in T.INTEGRAL:
            return "bigint"
        ps = T.decimal_ps(first)
        if ps:
            return f"decimal({min(38, ps[0] + 10)},{ps[1]})"
        return "double" if first != T.UNKNOWN else T.UNKNOWN
    if name == "avg":
        ps = T.decimal_ps(first)
        if ps:
            return f"decimal({min(38, ps[0] + 4)},{min(38, ps[1] + 4)})"
        return "double"
    if name in ("round", "bround"):
        return first
    if name in ("floor", "ceil"):
        return "bigint" if first in T.INTEGRAL + T.FRACTIONAL else first
    if name in _ARG_FNS:
        return first
    if name in _WIDER_FNS:
        out = "void"
        for t in arg_types:
            out = T.wider(out, t)
        return out
    if name == "if":
        return T.wider(arg_types[1], arg_types[2]) if len(arg_types) == 3 else T.UNKNOWN
    if name in _STRING_FNS:
        return "string"
    if name in _INT_FNS:
        return "int"
    if name in _DOUBLE_FNS:
        return "double"
    if name in _BOOL_FNS:
        return "boolean"
    if name in _TS_FNS:
        return "timestamp"
    if name in _DATE_FNS:
        return "date"
    if name in ("collect_list", "collect_set", "array_agg"):
        return f"array<{first}>"
    if name == "array":
        out = "void"
        for t in arg_types:
            out = T.wider(out, t)
        return f"array<{out if out != 'void' else 'string'}>"
    if name in ("split", "sentences"):
        return "array<string>"
    if name in ("element_at", "get"):
        if first.startswith("array<"):
            return T.array_element(first)
        if first.startswith("map<"):
            return T.map_kv(first)[1]
        return T.UNKNOWN
    if name in ("array_distinct", "array_sort", "sort_array", "array_remove", "slice",
                "array_union", "array_intersect", "array_except", "shuffle", "reverse"):
        return first
    if name == "struct":
        fields = []
        for i, (a, t) in enumerate(zip(args, arg_types)):
            fname = a[1][-1] if a[0] == "col" else f"col{i + 1}"
            fields.append(f"{fname}:{t}")
        return "struct<" + ",".join(fields) + ">"
    if name == "named_struct":
        fields = []
        for i in range(0, len(args) - 1, 2):
            if args[i][0] == "lit":
                fields.append(f"{args[i][2].lower()}:{arg_types[i + 1]}")
        return "struct<" + ",".join(fields) + ">"
    if name in ("window", "session_window"):
        return "struct<start:timestamp,end:timestamp>"
    if name == "map":
        if len(arg_types) >= 2:
            return f"map<{arg_types[0]},{arg_types[1]}>"
        return T.UNKNOWN
    if name in ("int", "smallint", "tinyint", "float", "binary"):
        return name
    return T.UNKNOWN


def _ansi(ast: Ast, refusal: A.Refusal | None) -> None:
    """Raise what Spark's analyzer would say (ANSI mode) about ``ast``, if anything."""
    if refusal is None:
        return
    text = render(ast)
    if len(text) > 80:
        text = text[:77] + "..."
    raise ExpressionError(f"type mismatch in '{text}': {refusal.why} (Spark refuses it "
                          "under ANSI mode)", expected=refusal.expected, found=refusal.found)


def _unknown_column(parts: tuple[str, ...], scope: Scope) -> ExpressionError:
    name = ".".join(parts)
    known = sorted(scope.columns)
    for q, cols in scope.qualified.items():
        known.extend(f"{q}.{c}" for c in cols)
    return ExpressionError(f"column '{name}' does not exist in the input",
                           expected="one of " + ", ".join(known[:12]) +
                           (" …" if len(known) > 12 else ""),
                           found=f"'{name}'")


def contains_aggregate(ast: Ast) -> bool:
    return any(n[0] == "fn" and n[1] in _AGG_FUNCTIONS for n in walk(ast))


# ---------------------------------------------------------------------------------------
# Cached analysis: what validation needs, computed once per expression shape
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExprInfo:
    ast: Ast
    columns: tuple[tuple[str, ...], ...]
    functions: frozenset[str]
    has_aggregate: bool
    deterministic: bool


_INFO_BY_TEXT: dict[str, ExprInfo] = {}
_INFO_BY_AST: dict[int, ExprInfo] = {}
_TYPE_CACHE: dict[tuple[int, tuple[str | None, ...]], str] = {}


def analyze(text: str) -> ExprInfo:
    """Parse (by shape) and summarise an expression; cached per text and per shape."""
    found = _INFO_BY_TEXT.get(text)
    if found is not None:
        return found
    ast = shape(text)
    found = _INFO_BY_AST.get(id(ast))
    if found is None:
        fns = frozenset(functions(ast))
        found = ExprInfo(ast, tuple(sorted(columns(ast))), fns, bool(fns & _AGG_FUNCTIONS),
                         not (fns & NONDETERMINISTIC_FUNCTIONS))
        _INFO_BY_AST[id(ast)] = found
    _INFO_BY_TEXT[text] = found
    return found


def type_of(info: ExprInfo, scope: Scope, text: str | None = None) -> str:
    """``infer_type`` memoised on the expression shape and the types of its columns.

    ``text`` is the expression as written: an error found on its shape is said again in
    the user's own words (``ts > 5``, not the shape's ``ts > 1``)."""
    col_types = tuple(scope.resolve(c) for c in info.columns)
    key = (id(info), col_types)
    t = _TYPE_CACHE.get(key)
    if t is None:
        try:
            t = infer_type(info.ast, scope)  # raises on an unknown column
        except ExpressionError:
            if text is not None:
                own = parse(text)
                if own is not info.ast:
                    infer_type(own, scope)
            raise
        if not scope.qualified:
            _TYPE_CACHE[key] = t
    return t


def clear_caches() -> None:
    for memo in (_PARSE_CACHE, _SHAPE_CACHE, _CANON_CACHE, _INFO_BY_TEXT, _INFO_BY_AST,
                 _TYPE_CACHE):
        memo.clear()
