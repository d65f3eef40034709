"""Constant folding: compute what does not depend on a row once, at compile time.

``1 + 2 + x`` becomes ``3 + x``, ``x > 2 * 5`` becomes ``x > 10``, ``'a' || 'b'`` becomes
``'ab'``, ``x > 1 AND TRUE`` becomes ``x > 1``; a filter whose predicate folds to TRUE is
removed.

Only folds that give Spark's result, with Spark's type, are done.  sqlglot's simplifier does
the arithmetic, but it is called only on literal operands this module accepts: integers whose
result stays in the type Spark would use (``2147483647 + 1`` overflows an int in Spark, so it is
left alone), comparisons of two numbers or two strings, string concatenation, and the boolean
identities ``x AND TRUE``, ``x OR FALSE``, ``x AND FALSE``, ``x OR TRUE`` and ``NOT TRUE``.
Nothing is reassociated (``x + 1 + 2`` stays: floating point and ANSI overflow make it
unsafe), deduplicated (``rand() < 0.5 AND rand() < 0.5`` is two draws) or rewritten for
taste (``BETWEEN`` stays ``BETWEEN``).
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal, InvalidOperation

from sqlglot import exp
from sqlglot.optimizer.simplify import Simplifier

from compat.sql import ir
from compat.steps import Filter, Join

_INT = (-(2 ** 31), 2 ** 31 - 1)
_BIGINT = (-(2 ** 63), 2 ** 63 - 1)
_SIMPLIFIER = Simplifier(dialect=ir.DIALECT, annotate_new_expressions=False)


def constant_folding(graph: ir.Graph) -> ir.Graph:
    g = graph.copy()
    for sid in list(g.steps):
        s = ir.map_trees(g.steps[sid], fold)  # every expression of every step
        if isinstance(s, Filter) and _is_true(ir.parse(s.predicate)):
            # A filter that keeps every row is no step at all.
            for c in g.consumers(sid):
                g.rewire(c, sid, s.inputs[0])
            g.remove(sid)
            continue
        if isinstance(s, Join) and s.condition is not None and s.left_keys and \
                _is_true(ir.step_parse(s, s.condition, True)):
            s = dataclasses.replace(s, condition=None)
        g.put(s)
    return g


def _is_true(e: exp.Expression) -> bool:
    return isinstance(e, exp.Boolean) and e.this is True


def fold(e: exp.Expression) -> exp.Expression:
    """A folded copy of ``e`` (children first, so folds compose bottom-up)."""
    return _fold(e.copy())


def _fold(node: exp.Expression) -> exp.Expression:
    for k, v in list(node.args.items()):
        if isinstance(v, exp.Expression):
            node.set(k, _fold(v))
        elif isinstance(v, list):
            node.set(k, [_fold(x) if isinstance(x, exp.Expression) else x for x in v])
    return _fold_node(node)


def _fold_node(node: exp.Expression) -> exp.Expression:
    if isinstance(node, exp.Paren) and isinstance(node.this, (exp.Literal, exp.Boolean)):
        return node.this
    if isinstance(node, exp.Neg) and _int(node.this) is not None:
        return _number(-_int(node.this))  # type: ignore[operator]
    if isinstance(node, (exp.Add, exp.Sub, exp.Mul)):
        return _arith(node)
    if isinstance(node, (exp.EQ, exp.NEQ, exp.LT, exp.LTE, exp.GT, exp.GTE)):
        return _compare(node)
    if isinstance(node, exp.DPipe) and _string(node.this) and _string(node.expression):
        return exp.Literal.string(node.this.this + node.expression.this)
    if isinstance(node, exp.Concat) and node.expressions and \
            all(_string(x) for x in node.expressions):
        return exp.Literal.string("".join(x.this for x in node.expressions))
    if isinstance(node, (exp.And, exp.Or)):
        return _connector(node)
    if isinstance(node, exp.Not) and isinstance(node.this, exp.Boolean):
        return exp.Boolean(this=not node.this.this)
    return node


def _int(e: exp.Expression) -> int | None:
    """The value of an integer literal (``-5`` included), else None."""
    if isinstance(e, exp.Neg):
        v = _int(e.this)
        return -v if v is not None else None
    if isinstance(e, exp.Literal) and not e.is_string and e.this.isdigit():
        return int(e.this)
    return None


def _number(v: int) -> exp.Expression:
    lit = exp.Literal.number(abs(v))
    return exp.Neg(this=lit) if v < 0 else lit


def _arith(node: exp.Binary) -> exp.Expression:
    a, b = _int(node.this), _int(node.expression)
    if a is None or b is None:
        return node
    # Spark types an integer literal as int when it fits, as bigint otherwise; the result
    # has the wider operand type and must fit it (or Spark overflows / fails in ANSI mode).
    lo, hi = _INT if all(_INT[0] <= x <= _INT[1] for x in (a, b)) else _BIGINT
    folded = _SIMPLIFIER.simplify_literals(node.copy())
    value = _int(folded)
    if value is None or not lo <= value <= hi:
        return node
    return _number(value)


def _compare(node: exp.Binary) -> exp.Expression:
    a, b = node.this, node.expression
    if _numeric(a) is not None and _numeric(b) is not None or _string(a) and _string(b):
        folded = _SIMPLIFIER.simplify_literals(node.copy())
        if isinstance(folded, exp.Boolean):
            return folded
    return node


def _numeric(e: exp.Expression) -> Decimal | None:
    if isinstance(e, exp.Neg):
        v = _numeric(e.this)
        return -v if v is not None else None
    if isinstance(e, exp.Literal) and not e.is_string:
        try:
            return Decimal(e.this)
        except InvalidOperation:
            return None
    return None


def _string(e: exp.Expression) -> bool:
    return isinstance(e, exp.Literal) and e.is_string


def _connector(node: exp.Connector) -> exp.Expression:
    a, b = node.this, node.expression
    # AND: TRUE is the identity and FALSE absorbs (FALSE AND NULL is FALSE in SQL too);
    # OR: the other way round.
    unit, zero = (True, False) if isinstance(node, exp.And) else (False, True)
    for x, other in ((a, b), (b, a)):
        if isinstance(x, exp.Boolean):
            if x.this is unit:
                return other
            if x.this is zero:
                return exp.Boolean(this=zero)
    return node


__all__ = ["constant_folding", "fold"]
