"""A recursive step's loop as one Spark SQL ``WITH RECURSIVE`` query (issue 31).

The DataFrame loop of ``migrate.build.recursive`` builds a new query for every iteration,
and the driver analyses, optimises and plans each (about 250 ms at 10k nodes) before its
jobs run.  Spark's ``WITH RECURSIVE`` plans its loop once and substitutes each level's rows
into the plan inside the JVM.  This module writes that query: pure text, no Spark.

What Spark 4.3's recursive CTE accepts decides what is written here:

* ``UNION ALL`` only (``UNION`` is ``UNION_NOT_SUPPORTED_IN_RECURSIVE_CTE``), and the
  recursive term sees the previous level's rows alone.  So set semantics is kept outside
  the CTE's own union: every level is made distinct (``DISTINCT``: a ``GROUP BY`` over the
  recursive reference is ``INVALID_RECURSIVE_REFERENCE``) and anti-joined with the rows known
  before the query (earlier batches, earlier chunks); a row reached again at a later level
  of the same query is dropped afterwards (the smallest level wins: the level at which the
  DataFrame loop derives it first).  A cycle among new rows would go round until the
  level bound, so the caller runs the recursion in chunks of levels (``stop``) and stops
  when a chunk's last level holds nothing new.
* Each row carries its level (``LVL``): the base rows 0, the old rows extended by new
  stream rows 1 (as in the loop's first iteration), and the recursive term stops at
  ``stop``.  That gives the loop's iteration count and ``max_iterations`` exactly.
* The recursive reference may not sit on the right of a left-semi join (nor in an outer
  join).

Only the body nodes that read the loop (a chain from ``body_input`` to ``body_output``,
one path in a linear body) are written as SQL; the rest of the body reads further inputs
only, so the caller builds it with the DataFrame builders once per batch and passes it as
a view.  A body that does not fit (``why_not``) keeps the DataFrame loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import singledispatch

from compat.infer import INSERT, NodeInfo
from compat.model import Node
from compat.steps import Explode, Filter, Join, Project, Recursive
from compat.steps.join import join_output
from compat.steps.recursive import body_order, body_paths

#: each row's level in the recursion: 0 for the base rows
LVL = "__theseus_lvl"
#: the name of the recursive CTE
LOOP = "__theseus_loop"
#: a row as one struct column (as ``migrate.build.recursive.KEY``)
ROW = "__theseus_row"
#: join types whose SQL is written here (a body reads inner and left-semi joins only)
_JOINS = {"inner": "JOIN", "left_semi": "LEFT SEMI JOIN"}


def q(name: str) -> str:
    """An identifier quoted for Spark SQL."""
    return "`" + name.replace("`", "``") + "`"


def _lit(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def loop_chain(rec: Recursive) -> list[str]:
    """The body nodes that read the loop's rows, inputs first."""
    body = {n.id: n for n in rec.body}
    reads = {rec.body_input}
    chain = []
    for bid in body_order(rec):
        if any(i in reads for i in body[bid].inputs):
            reads.add(bid)
            chain.append(bid)
    return chain


def why_not(rec: Recursive, infos: dict[str, NodeInfo]) -> str | None:
    """Why the body cannot run as ``WITH RECURSIVE``, or None when it can."""
    if any(n > 1 for n in body_paths(rec).values()):
        return "the body reads an input along several paths (not linear)"
    chain = loop_chain(rec)
    if rec.body_output not in chain:
        return "the body's output does not read the loop"
    body = {n.id: n for n in rec.body}
    on_chain = {rec.body_input, *chain}
    for bid in chain:
        node = body[bid]
        if infos[bid].mode != INSERT or infos[bid].changelog:
            return f"body step '{bid}' emits changes, not inserts"
        if _writer(node) is None:
            return f"body step '{bid}' ({node.step}) reads the loop and has no SQL form here"
        if isinstance(node, Join):
            if node.type not in _JOINS:
                return f"body step '{bid}' is a {node.type} join"
            if node.type == "left_semi" and node.inputs[1] in on_chain:
                # Spark refuses a recursive reference on the right of a left-semi join
                return f"body step '{bid}' reads the loop on the right of a left-semi join"
    return None


def side_inputs(rec: Recursive) -> list[str]:
    """The inputs of the loop's chain that do not read the loop (further inputs, or body
    nodes over further inputs only): the caller passes each as a view."""
    chain = loop_chain(rec)
    on_chain = {rec.body_input, *chain}
    body = {n.id: n for n in rec.body}
    out: list[str] = []
    for bid in chain:
        out += [i for i in body[bid].inputs if i not in on_chain and i not in out]
    return out


@dataclass(frozen=True)
class Query:
    """What one ``WITH RECURSIVE`` query reads: the view of its first level's rows
    (``anchor``: the row's columns and ``LVL``), the view of each side input by id, the
    views of the rows known before it (``known``: one ``ROW`` column each; set semantics)
    and the last level it derives (``stop``, above the anchor's level ``start``)."""

    anchor: str
    sides: dict[str, str]
    known: tuple[str, ...]
    start: int
    stop: int


def with_recursive(rec: Recursive, infos: dict[str, NodeInfo],
                   row: list[tuple[str, str]], qy: Query) -> str:
    """The query: the rows of levels ``start`` to ``stop`` (each with its ``LVL``).

    ``row`` is the loop's columns as (name, Spark SQL type); ``rec.union`` says bag or set.
    With set semantics each level is distinct and holds no row of ``qy.known``; a row may
    still appear at several levels (the caller keeps its smallest)."""
    body = {n.id: n for n in rec.body}
    cols = [n for n, _ in row]
    # the previous level's rows, one level further, as the body reads them
    frames: dict[str, str] = {rec.body_input: (
        f"SELECT {', '.join(q(c) for c in cols)}, {q(LVL)} + 1 AS {q(LVL)} "
        f"FROM {q(LOOP)} WHERE {q(LVL)} < {qy.stop}")}
    for sid, view in qy.sides.items():
        frames[sid] = f"SELECT * FROM {q(view)}"
    for bid in loop_chain(rec):
        node = body[bid]
        write = _writer(node)
        assert write is not None, why_not(rec, infos)
        frames[bid] = write(node, frames, infos, rec)
    out = infos[rec.body_output].names
    typed = [f"CAST(b.{q(o)} AS {t}) AS {q(c)}" for o, (c, t) in zip(out, row)]
    step = f"SELECT {', '.join(typed)}, b.{q(LVL)} FROM ({frames[rec.body_output]}) AS b"
    if rec.union == "set":
        fields = ", ".join(f"{_lit(c)}, {q(c)}" for c in cols)
        keyed = f"SELECT named_struct({fields}) AS {q(ROW)}, {q(LVL)} FROM ({step}) AS s"
        hint = ", ".join(f"k{i}" for i in range(len(qy.known)))
        # The rows known are hash-partitioned and sorted on ROW: merge joins shuffle the
        # level's rows once, on ROW, and DISTINCT (Spark refuses a GROUP BY over the
        # recursive reference) keeps that partitioning.  A broadcast of the rows known
        # would be a job of its own at every level.
        distinct = (f"SELECT {f'/*+ MERGE({hint}) */ ' if hint else ''}DISTINCT "
                    f"c.{q(ROW)}, c.{q(LVL)} FROM ({keyed}) AS c"
                    + "".join(f" LEFT ANTI JOIN {q(v)} AS k{i} ON c.{q(ROW)} = k{i}.{q(ROW)}"
                              for i, v in enumerate(qy.known)))
        step = ("SELECT " + ", ".join(f"d.{q(ROW)}.{q(c)} AS {q(c)}" for c in cols)
                + f", d.{q(LVL)} FROM ({distinct}) AS d")
    names = ", ".join(q(c) for c in [*cols, LVL])
    # Spark's own level bound only guards: the recursive term stops at ``stop`` itself
    levels = qy.stop - qy.start + 2
    return (f"WITH RECURSIVE {q(LOOP)}({names}) MAX RECURSION LEVEL {levels} AS ("
            f"SELECT {names} FROM {q(qy.anchor)} UNION ALL {step}) "
            f"SELECT {names} FROM {q(LOOP)}")


Writer = Callable[[Node, dict[str, str], dict[str, NodeInfo], Recursive], str]


@singledispatch
def _sql(node: Node, frames: dict[str, str], infos: dict[str, NodeInfo],
         rec: Recursive) -> str:
    raise NotImplementedError(node.step)


def _writer(node: Node) -> Writer | None:
    """The SQL writer of a body step that reads the loop, or None (a union: a branch
    that does not read the loop would have no level)."""
    fn = _sql.dispatch(type(node))
    return None if fn is _sql.dispatch(Node) else fn


def _from(frames: dict[str, str], nid: str) -> str:
    return f"({frames[nid]}) AS {q(nid)}"


@_sql.register
def _project(node: Project, frames: dict[str, str], infos: dict[str, NodeInfo],
             rec: Recursive) -> str:
    cols = [f"{c.expr} AS {q(c.name)}" for c in node.columns]
    return f"SELECT {', '.join(cols)}, {q(LVL)} FROM {_from(frames, node.inputs[0])}"


@_sql.register
def _filter(node: Filter, frames: dict[str, str], infos: dict[str, NodeInfo],
            rec: Recursive) -> str:
    return f"SELECT * FROM {_from(frames, node.inputs[0])} WHERE ({node.predicate})"


@_sql.register
def _explode(node: Explode, frames: dict[str, str], infos: dict[str, NodeInfo],
             rec: Recursive) -> str:
    fn = "explode_outer" if node.outer else "explode"
    return f"SELECT *, {fn}({node.expr}) AS {q(node.alias)} FROM {_from(frames, node.inputs[0])}"


@_sql.register
def _join(node: Join, frames: dict[str, str], infos: dict[str, NodeInfo],
          rec: Recursive) -> str:
    # As the DataFrame builder (migrate.build.join): keys computed on each side under
    # names of their own, each side known by its input's id (the condition's qualifier).
    lid, rid = node.inputs
    sides = []
    for nid, keys, tag in ((lid, node.left_keys, "lk"), (rid, node.right_keys, "rk")):
        extra = "".join(f", {e} AS {q(f'__theseus_{tag}{i}')}" for i, e in enumerate(keys))
        sides.append(f"(SELECT *{extra} FROM ({frames[nid]}) AS {q(nid)}) AS {q(nid)}")
    cond = [f"{q(lid)}.{q(f'__theseus_lk{i}')} = {q(rid)}.{q(f'__theseus_rk{i}')}"
            for i in range(len(node.left_keys))]
    cond += [f"({e})" for e in (node.condition, node.time_bound) if e]
    out = [f"{q(lid if side == 'left' else rid)}.{q(src)} AS {q(name)}"
           for name, side, src in join_output(node, infos[lid].names, infos[rid].names)]
    loop_side = lid if _reads_loop(rec, lid) else rid
    return (f"SELECT {', '.join(out)}, {q(loop_side)}.{q(LVL)} FROM {sides[0]} "
            f"{_JOINS[node.type]} {sides[1]} ON {' AND '.join(cond) or 'true'}")


def _reads_loop(rec: Recursive, nid: str) -> bool:
    return nid == rec.body_input or nid in loop_chain(rec)
