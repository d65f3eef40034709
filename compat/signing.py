"""Sharing signatures, per step: the registry ``sign_step`` and the pieces it hashes with.

A node's signature (``compat.fleet.signature``) is a hash of the canonical form of its
subplan.  Each step type registers with ``sign_step``, in its own module, how it adds
itself to its inputs' signatures: ``(node, ins, names, plan) -> NodeSig``, ``ins`` being
its inputs' ``NodeSig`` in order and ``names`` its output column names as inferred.  A
registration hashes the step's name, its version, its inputs' signatures and what it
computes, with expressions canonical over *column tokens* (``by_name``, ``canon``,
``expr_token``) so that aliases do not count.  A step that changes nothing about its rows
passes its input's ``NodeSig`` on.

This module sits below ``compat/steps/`` (it imports no step) so that every step module can
register here; ``compat.fleet`` drives the registrations.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import singledispatch
from typing import Any

from compat import expr as E
from compat.infer import duration_seconds
from compat.model import Node, Plan


@dataclass(frozen=True)
class NodeSig:
    """A node's signature, its output columns' tokens by lower-case name, and, for a filter,
    the conjuncts of the chain of filters it ends and the signature below that chain."""

    sig: str
    columns: Mapping[str, str]
    conjuncts: frozenset[str] = frozenset()
    base: str = ""


@singledispatch
def sign_step(node: Node, ins: list[NodeSig], names: tuple[str, ...], plan: Plan) -> NodeSig:
    """``node``'s signature from its inputs' (``ins``, in order) and its output column
    names.  Every step type registers its own (``@sign_step.register``)."""
    raise NotImplementedError(f"no sharing signature is registered for step '{node.step}'")


def digest(*parts: Any) -> str:
    """The SHA-256 (hex) of ``parts``: a signature."""
    return hashlib.sha256(repr(parts).encode("utf-8", "backslashreplace")).hexdigest()


def token(*parts: Any) -> str:
    """A column token: names what a column computes (``$`` and 20 hex digits)."""
    return "$" + digest(*parts)[:20]


# -- expressions over column tokens -------------------------------------------------------------

Resolver = Callable[[tuple[str, ...]], tuple[str, ...] | None]


def _subst(ast: Any, resolve: Resolver, bound: frozenset[str] = frozenset()) -> Any:
    """``ast`` with every column reference that ``resolve`` knows replaced by its token (the
    rest of a dotted reference, a struct field, kept); lambda parameters stay as written."""
    tag = ast[0]
    if tag == "col":
        parts = ast[1]
        if parts[0] in bound:
            return ast
        new = resolve(parts)
        return ast if new is None else ("col", new)
    if tag == "lambda":
        return ("lambda", ast[1], _subst(ast[2], resolve, bound | frozenset(ast[1])))
    if tag == "field":  # ``f(x).a``: the field name is data, the inner part an expression
        return ("field", _subst(ast[1], resolve, bound), ast[2])
    out: list[Any] = [tag]
    for part in ast[1:]:
        out.append(_subst_part(part, resolve, bound))
    return tuple(out)


def _subst_part(part: Any, resolve: Resolver, bound: frozenset[str]) -> Any:
    if isinstance(part, tuple) and part:
        if isinstance(part[0], str):
            return _subst(part, resolve, bound) if part[0] in E._TAGS else part
        return tuple(_subst_part(p, resolve, bound) for p in part)
    return part


def by_name(columns: Mapping[str, str]) -> Resolver:
    """Resolves a column reference by its (lower-case) name in ``columns``."""
    def resolve(parts: tuple[str, ...]) -> tuple[str, ...] | None:
        tok = columns.get(parts[0])
        return None if tok is None else (tok,) + parts[1:]
    return resolve


def canon_ast(text: str, resolve: Resolver) -> Any:
    """The normalized tree of ``text`` with its columns resolved to tokens."""
    return E.normalize(_subst(E.parse(text), resolve))


def canon_expr(text: str, resolve: Resolver) -> str:
    """``text`` in canonical form over column tokens."""
    if text.strip() == "*":
        return "*"
    return E.render(canon_ast(text, resolve))


def expr_token(text: str, resolve: Resolver) -> str:
    """The token of a computed column: a bare column keeps its token (a rename is free)."""
    ast = canon_ast(text, resolve)
    if ast[0] == "col" and len(ast[1]) == 1 and ast[1][0].startswith("$"):
        return ast[1][0]
    return token("expr", E.render(ast))


def conjuncts(ast: Any) -> list[Any]:
    """The operands of a tree's top-level ``AND``s."""
    if ast[0] == "bin" and ast[1] == "and":
        return conjuncts(ast[2]) + conjuncts(ast[3])
    return [ast]


def duration(text: str | None) -> Any:
    """A duration in seconds (``10 minutes`` equals ``600 seconds``), else its normalized
    text."""
    if text is None:
        return None
    s = duration_seconds(text)
    return s if s is not None else " ".join(text.lower().split())


def type_key(t: str) -> str:
    """A Spark SQL type string with case and spacing that do not matter removed."""
    return "".join(t.lower().split())


__all__ = ["NodeSig", "Resolver", "by_name", "canon_ast", "canon_expr", "conjuncts", "digest",
           "duration", "expr_token", "sign_step", "token", "type_key"]
