"""SELECT statements to a graph of plan steps, one clause at a time.

A SELECT is read in Spark's logical order: FROM (tables, subqueries, joins, LATERAL VIEW),
WHERE, GROUP BY with its aggregates, HAVING, the SELECT list, DISTINCT.  Every column
reference is resolved here, against the columns in scope, so that a misspelt name is reported
where it was written; the graph holds only resolved expressions, written as Spark SQL.

Two query shapes are rewritten as in Flink SQL: ``ROW_NUMBER() OVER (PARTITION BY k ORDER BY
x) AS rn`` in a subquery filtered by ``rn <= N`` becomes a ``top_n`` step, and becomes a
``deduplicate`` step when N is 1 and the order is the event-time column ascending.  The row
number itself is not an output column.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlglot import exp

from compat import expr as E
from compat.errors import PlanError, SqlError
from compat.infer import duration_seconds
from compat.model import AggCall, NamedExpr, OrderKey, Window
from compat.sql import ir
from compat.sql.recursive import reference, with_recursive
from compat.sql.scope import Rel, ScopeCol, column_names
from compat.sql.script import Script, Table, source_step
from compat.sql.text import Span, SqlText, did_you_mean, span_of
from compat.steps import Aggregate, Deduplicate, Explode, Filter, Join, Project, TopN, Union
from compat.steps.join import join_output, paired_keys

#: the one optimizer hint: how long a deduplication remembers a key
HINTS = ("DEDUP_WITHIN",)


@dataclass
class Output:
    """What the top-level query produced, for the sink's defaults."""

    rel: Rel
    #: output names of the GROUP BY columns (without the window), when the query aggregates
    group_keys: list[str] | None = None
    #: GROUP BY columns missing from the output (so there is no default key)
    missing_keys: list[str] = field(default_factory=list)


@dataclass
class _Hints:
    dedup_within: str | None = None
    span: Span | None = None


_AGG_OUT = "theseus_agg_out"  # meta flag: a column of the aggregate's output
#: the name a bare reference to the window column was written with (its output name)
_WINDOW_NAME = "theseus_window_name"
_CLAUSES = {"sample": "TABLESAMPLE", "pivots": "PIVOT", "laterals": "LATERAL",
            "joins": "JOIN", "hints": "a hint"}


class Translator:
    def __init__(self, src: SqlText, script: Script) -> None:
        self.src = src
        self.script = script
        #: the query reads tables only: they are read as changelogs (compat.sql.script)
        self._table_only: bool | None = None
        self.graph = ir.Graph(on_error=lambda g, e: plan_error(src, script, g, e))
        self.counters: dict[str, int] = {}
        # Table and view names, and the sink's, can never be generated ids.
        self.reserved = {t.name.lower() for t in script.tables.values()}
        self.group_keys: list[str] | None = None
        #: the names the current GROUP BY's window column answers to (``aggregate``)
        self.window_names: tuple[str, ...] = ("window",)
        self.missing_keys: list[str] = []

    # -- entry ----------------------------------------------------------------------------

    def translate(self, query: exp.Expression) -> Output:
        rel = self.query(query, {})
        return Output(rel, self.group_keys, self.missing_keys)

    def new_id(self, prefix: str) -> str:
        n = self.counters.get(prefix, 0)
        while True:
            n += 1
            sid = f"{prefix}_{n}"
            if sid not in self.graph.steps and sid.lower() not in self.reserved:
                self.counters[prefix] = n
                return sid

    def err(self, message: str, where: exp.Expression | Span | None) -> SqlError:
        return self.src.error(message, where)

    # -- queries --------------------------------------------------------------------------

    def query(self, q: exp.Expression, ctes: dict[str, tuple[exp.Expression, dict]]) -> Rel:
        ctes = self._with(q, ctes)
        if isinstance(q, exp.Subquery):
            return self.query(q.this, ctes)
        if isinstance(q, exp.Union):
            return self.union(q, ctes)
        if isinstance(q, (exp.Intersect, exp.Except)):
            raise self.err(f"{q.key.upper()} is not supported on streams (UNION ALL is)", q)
        if isinstance(q, exp.Select):
            return self.select(q, ctes)
        raise self.err(f"expected a SELECT, found {q.key.upper()}", q)

    def _with(self, q: exp.Expression, ctes: dict) -> dict:
        w = q.args.get("with_") or q.args.get("with")
        if not w:
            return ctes
        if w.args.get("recursive"):
            return with_recursive(self, w, ctes)
        out = dict(ctes)
        for cte in w.expressions:
            out[cte.alias_or_name.lower()] = (cte.this, dict(out))
        return out

    def union(self, q: exp.Union, ctes: dict) -> Rel:
        for k, word in (("order", "ORDER BY"), ("limit", "LIMIT"), ("offset", "OFFSET")):
            if q.args.get(k):
                raise self.err(f"{word} on a UNION is not supported on a stream", q.args[k])
        distinct = bool(q.args.get("distinct"))
        branches: list[exp.Expression] = []

        def collect(node: exp.Expression) -> None:
            if isinstance(node, exp.Union) and bool(node.args.get("distinct")) == distinct \
                    and not node.args.get("with_") and not any(
                        node.args.get(k) for k in ("order", "limit")):
                collect(node.this)
                collect(node.expression)
            else:
                branches.append(node)

        collect(q.this)
        collect(q.expression)
        rels = [self.query(b, ctes) for b in branches]
        names = [c for c in column_names(rels[0])]
        inputs = [rels[0].id]
        for b, r in zip(branches[1:], rels[1:]):
            other = column_names(r)
            if len(other) != len(names):
                raise self.err(f"UNION branches have {len(names)} and {len(other)} columns",
                               b)
            if [n.lower() for n in other] != [n.lower() for n in names]:
                # Spark's UNION matches columns by position; a plan's union by name.
                pid = self.new_id("select")
                self.graph.add(Project(id=pid, inputs=(r.id,), columns=tuple(
                    NamedExpr(n, ir.sql(ir.col(p))) for n, p in zip(names, column_names(r)))),
                    span_of(b))
                r = Rel(pid, [])
            inputs.append(r.id)
        uid = self.new_id("union")
        self.graph.add(Union(id=uid, inputs=tuple(inputs)), span_of(q))
        rel = Rel(uid, [ScopeCol(None, n, n) for n in names])
        self.group_keys, self.missing_keys = None, []
        if distinct:
            rel = self.distinct(rel, q, _Hints())
        return rel

    # -- SELECT ---------------------------------------------------------------------------

    def select(self, s: exp.Select, ctes: dict) -> Rel:
        self._refuse_clauses(s)
        hints = self._hints(s)
        if not s.args.get("from_"):
            raise self.err("a SELECT without FROM has no input stream", s)
        pattern = self._rank_pattern(s)
        if pattern is not None:
            return self._select_ranked(s, pattern, ctes, hints)
        self._refuse_windows(s)
        rel = self.from_where(s, ctes)
        self.group_keys, self.missing_keys = None, []
        items = list(s.expressions)
        group = s.args.get("group")
        having = s.args.get("having")
        aggregating = bool(group) or bool(having) or any(_has_agg(i) for i in items)
        if aggregating:
            if any(_generator(i) is not None for i in items):
                raise self.err("explode() in the SELECT list of an aggregating query is not "
                               "supported (use LATERAL VIEW explode(...) in FROM)", s)
            rel = self.aggregate(s, rel, items, group, having)
        else:
            rel, items = self._select_generator(rel, items)
            rel = self.project(rel, items, s)
        if s.args.get("distinct"):
            rel = self.distinct(rel, s.args["distinct"], hints)
        elif hints.dedup_within:
            raise self.err("DEDUP_WITHIN applies to SELECT DISTINCT or to the deduplication "
                           "pattern (ROW_NUMBER() ... ORDER BY <event time> ... WHERE rn = 1)",
                           hints.span)
        return rel

    def _refuse_clauses(self, s: exp.Select) -> None:
        words = {"order": "ORDER BY", "limit": "LIMIT", "offset": "OFFSET",
                 "qualify": "QUALIFY", "sort": "SORT BY", "cluster": "CLUSTER BY",
                 "distribute": "DISTRIBUTE BY", "windows": "WINDOW", "into": "INTO",
                 "pivots": "PIVOT", "settings": "SETTINGS", "connect": "CONNECT BY"}
        for k, word in words.items():
            v = s.args.get(k)
            if v:
                extra = " (for the first N rows per key, use the Top-N pattern: ROW_NUMBER() " \
                    "OVER (PARTITION BY ... ORDER BY ...) AS rn ... WHERE rn <= N)" \
                    if k in ("order", "limit", "sort") else ""
                node = v[0] if isinstance(v, list) else v
                raise self.err(f"{word} is not supported in a streaming query{extra}", node)
        d = s.args.get("distinct")
        if d is not None and d.args.get("on"):
            raise self.err("DISTINCT ON is not supported (use the deduplication pattern "
                           "with ROW_NUMBER())", d)

    def _refuse_windows(self, s: exp.Select) -> None:
        for w in s.find_all(exp.Window):
            if _enclosing_select(w) is s:
                raise self.err("window functions are supported only in the Top-N pattern: "
                               "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY ... "
                               "ORDER BY ...) AS rn FROM t) WHERE rn <= N", w)

    def _hints(self, s: exp.Select) -> _Hints:
        out = _Hints()
        hint = s.args.get("hint")
        if not hint:
            return out
        for h in hint.expressions:
            if not isinstance(h, exp.Expression):  # text sqlglot could not read as a call
                raise self.err("cannot read this hint (supported: " + ", ".join(HINTS) +
                               ", e.g. /*+ DEDUP_WITHIN('1 hour') */)", span_of(hint))
            name = (h.name or h.sql(dialect=ir.DIALECT)).split("(")[0].strip().upper()
            if name != "DEDUP_WITHIN":
                raise self.err(f"hint {name} is not supported (supported: " +
                               ", ".join(HINTS) + ")", span_of(hint))
            args = h.expressions if isinstance(h, exp.Anonymous) else []
            value = _duration_text(args[0]) if len(args) == 1 else None
            if value is None or duration_seconds(value) is None:
                raise self.err("DEDUP_WITHIN takes one duration, e.g. "
                               "/*+ DEDUP_WITHIN('1 hour') */", span_of(hint))
            out.dedup_within, out.span = value, span_of(hint)
        return out

    # -- FROM -----------------------------------------------------------------------------

    def from_where(self, s: exp.Select, ctes: dict) -> Rel:
        """FROM, then WHERE.

        Tables listed with commas (``FROM a, b``, or ``a CROSS JOIN b`` without ON, which
        sqlglot reads the same) are joined on WHERE's equalities, as Spark's optimizer turns
        the cross join and the filter into an inner join: the conjuncts that pair a column of
        each side, and a range over both streams' event times, become the ON clause of the
        same join ``JOIN ... ON`` builds; the other conjuncts stay in WHERE.
        """
        where = s.args.get("where")
        rest = ir.conjuncts(where.this) if where else []
        rel = self.relation(s.args["from_"].this, ctes)
        joins = s.args.get("joins") or []
        listed = [rel]
        pending: list[tuple[Rel, exp.Join]] = []
        moved: list[exp.Expression] = []
        for i, j in enumerate(joins):
            if not _is_comma(j):
                rel = self.join(rel, j, ctes)
                continue
            later = next((k for k in joins[i + 1:] if not _is_comma(k)), None)
            if later is not None:
                # Spark reads `a, b JOIN c` as `a, (b JOIN c)`; sqlglot cannot tell it from
                # `a CROSS JOIN b JOIN c`, so refuse rather than guess the nesting.
                raise self.err("a JOIN after tables listed with commas is not supported: "
                               "write every join as JOIN ... ON, or list every table with "
                               "commas and join them in WHERE", later)
            right = self.relation(j.this, ctes)
            quals = {c.qualifier for r in [rel] + [r for r, _ in pending] for c in r.cols}
            clash = quals & {c.qualifier for c in right.cols} - {None}
            if clash:
                raise self.err(f"table name or alias '{sorted(clash)[0]}' is used twice in "
                               "FROM: give each an alias", j.this)
            listed.append(right)
            pending.append((right, j))
            # Join every waiting table that WHERE connects to those joined so far, in FROM
            # order: a table listed before the one it joins waits for it (Spark's
            # ReorderJoin also takes the first table with a join condition).
            joined = True
            while joined:
                joined = False
                for k, (r, rj) in enumerate(pending):
                    on, rest = self._comma_on(rel, r, rest)
                    if on:
                        explicit = rj.copy()
                        explicit.set("kind", None)
                        explicit.set("on", ir.and_all(on))
                        rel = self.join(rel, explicit, ctes, right=r)
                        moved += on
                        del pending[k]
                        joined = True
                        break
        if pending:
            # a misspelt column is a better message than the missing join it causes
            scope = rel.cols + [c for r, _ in pending for c in r.cols]
            for c in rest:
                self.resolve(c, scope, "WHERE")
            r, rj = pending[0]
            raise self.err("a join needs ON or USING with equality keys, or for tables "
                           "listed with commas an equality in WHERE: nothing in WHERE joins "
                           f"'{rj.this.alias_or_name}' to the other tables (WHERE a.k = b.k; "
                           "a cross join of streams never ends)", rj.this)
        if len(listed) > 2:
            # `*` lists the tables in FROM order, whatever order they were joined in
            order: dict[tuple[str | None, str], int] = {}
            for n, r in enumerate(listed):
                for c in r.cols:
                    order.setdefault((c.qualifier, c.name.lower()), n)
            rel = Rel(rel.id, sorted(rel.cols,
                                     key=lambda c: order.get((c.qualifier, c.name.lower()), 0)))
        for c in moved:
            # resolved against the two sides it joins; WHERE sees every table in FROM
            self.resolve(c, rel.cols, "WHERE")
        for lat in s.args.get("laterals") or []:
            rel = self.lateral(rel, lat)
        if moved and rest:
            rel = self.filter(rel, rest[0] if len(rest) == 1 else ir.and_all(rest),
                              "WHERE", "where")
        elif where and not moved:
            rel = self.filter(rel, where.this, "WHERE", "where")
        return rel

    def _comma_on(self, left: Rel, right: Rel, conds: list[exp.Expression]
                  ) -> tuple[list[exp.Expression], list[exp.Expression]]:
        """WHERE conjuncts that join ``left`` and ``right`` (an ON clause), and the others.

        Nothing moves unless an equality pairs the two sides: without one they are not
        joined yet.  A conjunct naming a table not yet joined stays for a later join.
        """
        lcols = [ScopeCol(c.qualifier, c.name, c.physical, ir.LEFT) for c in left.cols]
        rcols = [ScopeCol(c.qualifier, c.name, c.physical, ir.RIGHT) for c in right.cols]
        both = lcols + rcols
        streams = self.graph.is_stream(left.id) and self.graph.is_stream(right.id)
        marks = {ir.LEFT: self.graph.watermarks(left.id),
                 ir.RIGHT: self.graph.watermarks(right.id)}
        on: list[exp.Expression] = []
        keep: list[exp.Expression] = []
        keyed = False
        for c in conds:
            if not _in_scope(c, both):
                keep.append(c)
                continue
            r = self.resolve(c, both, "WHERE")
            if _pairs_sides(r):
                keyed = True
                on.append(c)
            elif streams and _event_time_range(r, marks):
                on.append(c)
            else:
                keep.append(c)
        return (on, keep) if keyed else ([], conds)

    def relation(self, t: exp.Expression, ctes: dict) -> Rel:
        if isinstance(t, exp.Table):
            return self.table(t, ctes)
        if isinstance(t, exp.Subquery):
            extra = sorted(k for k, v in t.args.items() if v and k not in ("this", "alias"))
            if extra:
                raise self.err(f"{_CLAUSES.get(extra[0], extra[0].upper())} on a subquery is "
                               "not supported", t)
            alias = t.args.get("alias")
            if alias is not None and alias.args.get("columns"):
                raise self.err("column aliases on a subquery are not supported (alias the "
                               "columns in its SELECT list)", alias)
            return self.query(t.this, ctes).requalify(t.alias or None)
        raise self.err(f"{t.key.upper()} in FROM is not supported (FROM takes tables, views "
                       "and subqueries)", t)

    def table(self, t: exp.Table, ctes: dict) -> Rel:
        if not isinstance(t.this, exp.Identifier):
            raise self.err("table functions are not supported in FROM (FROM takes tables, "
                           "views and subqueries)", t)
        extra = sorted(k for k, v in t.args.items()
                       if v and k not in ("this", "alias", "db", "catalog"))
        if extra:
            raise self.err(f"{_CLAUSES.get(extra[0], extra[0].upper())} on a table is not "
                           "supported", t)
        if t.args.get("db") or t.args.get("catalog"):
            raise self.err("qualified table names are not supported: declare the topic with "
                           "CREATE TABLE <name> ... USING kafka", t)
        alias = t.args.get("alias")
        if alias is not None and alias.args.get("columns"):
            raise self.err("column aliases on a table are not supported", alias)
        name = t.name
        qualifier = t.alias or name
        low = name.lower()
        if low in ctes:
            if not isinstance(ctes[low], tuple):  # a recursive CTE, or its loop inside it
                return reference(self, ctes[low], t, qualifier)
            q, defined = ctes[low]
            return self.query(q, defined).requalify(qualifier)
        if low in self.script.views:
            return self.query(self.script.views[low], {}).requalify(qualifier)
        table = self.script.tables.get(low)
        if table is None:
            known = [x.name for x in self.script.tables.values()] + list(ctes) + \
                list(self.script.views)
            raise self.err(f"unknown table '{name}'" + did_you_mean(name, known) +
                           " (declare it with CREATE TABLE ... USING kafka)", t)
        if table is self.script.target:
            raise self.err(f"the query reads its own output table '{name}'", t)
        if table.columns is None:
            raise self.err(f"table '{name}' has no column list, so it cannot be read", t)
        return self._source(table, t, qualifier)

    def _source(self, table: Table, ref: exp.Table, qualifier: str) -> Rel:
        # Each reference reads the topic once: a second reference is a second source step.
        sid = table.name
        n = 1
        while sid in self.graph.steps:
            n += 1
            sid = f"{table.name}_{n}"
        if self._table_only is None:
            self._table_only = not self.script.reads_streams()
        step = source_step(self.src, table, sid, changelog=self._table_only)
        self.graph.add(step, table.span)
        q = qualifier.lower()
        return Rel(sid, [ScopeCol(q, c.name, c.name) for c in step.schema])

    # -- joins ----------------------------------------------------------------------------

    def join(self, left: Rel, j: exp.Join, ctes: dict, right: Rel | None = None) -> Rel:
        right = self.relation(j.this, ctes) if right is None else right
        clash = {c.qualifier for c in left.cols} & {c.qualifier for c in right.cols} - {None}
        if clash:
            raise self.err(f"table name or alias '{sorted(clash)[0]}' is used twice in FROM: "
                           "give each an alias", j.this)
        side = (j.side or "").upper()
        kind = (j.kind or "").upper()
        if j.args.get("method"):
            raise self.err(f"{j.args['method']} joins are not supported (write ON ...)", j)
        if kind == "CROSS" or (j.args.get("on") is None and not j.args.get("using")):
            raise self.err("a join needs ON or USING with equality keys (a cross join of "
                           "streams never ends)", j)
        jtype = {("", ""): "inner", ("", "INNER"): "inner", ("LEFT", ""): "left",
                 ("LEFT", "OUTER"): "left", ("RIGHT", ""): "right", ("RIGHT", "OUTER"): "right",
                 ("FULL", ""): "full", ("FULL", "OUTER"): "full", ("LEFT", "SEMI"): "left_semi",
                 ("", "SEMI"): "left_semi", ("LEFT", "ANTI"): "left_anti",
                 ("", "ANTI"): "left_anti"}.get((side, kind))
        if jtype is None:
            raise self.err(f"{side} {kind} JOIN is not supported".strip(), j)
        lcols = [ScopeCol(c.qualifier, c.name, c.physical, ir.LEFT) for c in left.cols]
        rcols = [ScopeCol(c.qualifier, c.name, c.physical, ir.RIGHT) for c in right.cols]
        both = lcols + rcols
        lkeys: list[exp.Expression] = []
        rkeys: list[exp.Expression] = []
        cond: list[exp.Expression] = []
        bound: list[exp.Expression] = []
        streams = self.graph.is_stream(left.id) and self.graph.is_stream(right.id)
        for u in j.args.get("using") or []:
            name = u.name
            lk = self.resolve(exp.column(name), lcols, "USING", span=span_of(u))
            rk = self.resolve(exp.column(name), rcols, "USING", span=span_of(u))
            lkeys.append(_unqualify(lk))
            rkeys.append(_unqualify(rk))
        for c in ir.conjuncts(j.args.get("on")):
            r = self.resolve(c, both, "ON")
            sides = _sides(r)
            if isinstance(r, exp.EQ):
                a, b = _sides(r.this), _sides(r.expression)
                if a == {ir.LEFT} and b == {ir.RIGHT}:
                    lkeys.append(_unqualify(r.this))
                    rkeys.append(_unqualify(r.expression))
                    continue
                if a == {ir.RIGHT} and b == {ir.LEFT}:
                    lkeys.append(_unqualify(r.expression))
                    rkeys.append(_unqualify(r.this))
                    continue
            if streams and sides == {ir.LEFT, ir.RIGHT} and \
                    isinstance(r, (exp.Between, exp.LT, exp.LTE, exp.GT, exp.GTE)):
                bound.append(r)
            else:
                cond.append(r)
        if not lkeys and not cond:
            raise self.err("a join needs equality keys between the two sides "
                           "(ON a.k = b.k)", j.args.get("on") or j)
        jid = self.new_id("join")
        inputs = (left.id, right.id)
        step = Join(id=jid, inputs=inputs, type=jtype,
                    left_keys=tuple(ir.sql(k) for k in lkeys),
                    right_keys=tuple(ir.sql(k) for k in rkeys),
                    condition=_qualified(ir.and_all(cond), inputs),
                    time_bound=_qualified(ir.and_all(bound), inputs))
        self.graph.add(step, span_of(j))
        # The join's output names (the plan's rule): map every right column to its new name.
        out = join_output(step, self.graph.columns(left.id), self.graph.columns(right.id))
        renamed = {src.lower(): name for name, side, src in out if side == "right"}
        paired = paired_keys(step)
        cols = list(left.cols)
        if jtype not in ("left_semi", "left_anti"):
            lphys = {c.lower(): c for c in self.graph.columns(left.id)}
            for c in right.cols:
                low = c.physical.lower()
                if low in renamed:
                    cols.append(ScopeCol(c.qualifier, c.name, renamed[low]))
                elif low in paired:
                    cols.append(ScopeCol(c.qualifier, c.name, lphys[low]))
        return Rel(jid, cols)

    def lateral(self, rel: Rel, lat: exp.Lateral) -> Rel:
        gen = lat.this
        if not lat.args.get("view") or not isinstance(gen, (exp.Explode, exp.ExplodeOuter)) \
                or isinstance(gen, exp.Posexplode):
            raise self.err("only LATERAL VIEW [OUTER] explode(...) is supported", lat)
        alias = lat.args.get("alias")
        names = [c.name for c in (alias.args.get("columns") or [])] if alias else []
        if len(names) > 1:
            raise self.err("explode() gives one column here (the elements of an array, or "
                           "struct<key,value> entries of a map): name one column", alias)
        outer = bool(lat.args.get("outer")) or isinstance(gen, exp.ExplodeOuter)
        return self._explode(rel, gen, names[0] if names else "col", outer,
                             alias.name if alias is not None else None, span_of(lat))

    def _explode(self, rel: Rel, gen: exp.Expression, alias: str, outer: bool,
                 qualifier: str | None, origin: Span | None, hidden: bool = False) -> Rel:
        e = self.resolve(gen.this, rel.cols, "explode()")
        if any(c.physical.lower() == alias.lower() for c in rel.cols):
            raise self.err(f"column '{alias}' already exists: name the exploded column "
                           "differently", gen)
        sid = self.new_id("explode")
        self.graph.add(Explode(id=sid, inputs=(rel.id,), expr=ir.sql(e), alias=alias,
                               outer=outer), origin)
        q = qualifier.lower() if qualifier else None
        return Rel(sid, rel.cols + [ScopeCol(q, alias, alias, hidden=hidden)])

    def _select_generator(self, rel: Rel,
                          items: list[exp.Expression]) -> tuple[Rel, list[exp.Expression]]:
        gens = [(i, g) for i, g in ((i, _generator(item)) for i, item in enumerate(items))
                if g is not None]
        if not gens:
            return rel, items
        if len(gens) > 1:
            raise self.err("only one explode() per SELECT list", items[gens[1][0]])
        i, gen = gens[0]
        if isinstance(gen, exp.Posexplode) or \
                not isinstance(gen, (exp.Explode, exp.ExplodeOuter)):
            raise self.err("only explode() and explode_outer() are supported", gen)
        item = items[i]
        alias = item.alias if isinstance(item, exp.Alias) else "col"
        rel = self._explode(rel, gen, alias, isinstance(gen, exp.ExplodeOuter), None,
                            span_of(item), hidden=True)
        items = list(items)
        items[i] = exp.column(alias)
        return rel, items

    # -- WHERE, projections, DISTINCT --------------------------------------------------------

    def filter(self, rel: Rel, cond: exp.Expression, clause: str, prefix: str) -> Rel:
        pred = self.resolve(cond, rel.cols, clause)
        sid = self.new_id(prefix)
        self.graph.add(Filter(id=sid, inputs=(rel.id,), predicate=ir.sql(pred)),
                       span_of(cond))
        return Rel(sid, rel.cols)

    def project(self, rel: Rel, items: list[exp.Expression], where: exp.Expression) -> Rel:
        out: list[tuple[str, exp.Expression, exp.Expression]] = []
        for item in items:
            if isinstance(item, exp.Star) or \
                    (isinstance(item, exp.Column) and isinstance(item.this, exp.Star)):
                q = item.table.lower() if isinstance(item, exp.Column) and item.table else None
                cols = [c for c in rel.cols
                        if (q is None or c.qualifier == q) and not c.hidden]
                if q is not None and not cols:
                    raise self.err(f"unknown table '{item.table}' in SELECT" +
                                   did_you_mean(item.table, {c.qualifier or "" for c in
                                                             rel.cols}), item)
                seen: set[str] = set()
                for c in cols:
                    if c.physical.lower() not in seen:
                        seen.add(c.physical.lower())
                        out.append((c.physical, ir.col(c.physical), item))
                continue
            alias = item.alias if isinstance(item, exp.Alias) else None
            raw = _unparen(item.this if isinstance(item, exp.Alias) else item)
            e = self.resolve(raw, rel.cols, "SELECT")
            out.append((alias or self._auto_name(e, rel), e, item))
        return self._project(rel, out, where)

    def _project(self, rel: Rel, out: list[tuple[str, exp.Expression, exp.Expression]],
                 where: exp.Expression) -> Rel:
        seen: dict[str, str] = {}
        for name, _e, item in out:
            if name.lower() in seen:
                raise self.err(f"duplicate output column '{name}' (Spark column names are "
                               "case-insensitive): alias one of them", item)
            seen[name.lower()] = name
        current = self.graph.columns(rel.id)
        identity = [n for n, _e, _i in out] == current and all(
            ir.bare_column(e) == n for n, e, _i in out)
        if identity:
            return Rel(rel.id, [ScopeCol(None, n, n) for n in current])
        sid = self.new_id("select")
        self.graph.add(Project(id=sid, inputs=(rel.id,),
                               columns=tuple(NamedExpr(n, ir.sql(e)) for n, e, _i in out)),
                       span_of(where) if not isinstance(where, exp.Select) else
                       _select_list_span(where))
        return Rel(sid, [ScopeCol(None, n, n) for n, _e, _i in out])

    def distinct(self, rel: Rel, where: exp.Expression, hints: _Hints) -> Rel:
        sid = self.new_id("distinct")
        keys = tuple(self.graph.columns(rel.id))
        self.graph.add(Deduplicate(id=sid, inputs=(rel.id,), keys=keys,
                                   within=hints.dedup_within),
                       # DISTINCT's keyword has no position: then the SELECT list's
                       span_of(where) or hints.span or self.graph.origins.get(rel.id))
        return Rel(sid, rel.cols)

    # -- GROUP BY -------------------------------------------------------------------------

    def aggregate(self, s: exp.Select, rel: Rel, items: list[exp.Expression],
                  group: exp.Group | None, having: exp.Having | None) -> Rel:
        for k in ("rollup", "cube", "grouping_sets", "totals"):
            if group is not None and group.args.get(k):
                raise self.err(f"GROUP BY {k.upper().replace('_', ' ')} is not supported",
                               group)
        gexprs = list(group.expressions) if group is not None else []
        for g in gexprs:
            if isinstance(g, (exp.Rollup, exp.Cube, exp.GroupingSets)):
                what = {"groupingsets": "GROUPING SETS"}.get(g.key, g.key.upper())
                raise self.err(f"GROUP BY {what} is not supported", g)
        # 1. The window, if any: window(ts, size[, slide]) or session_window(ts, gap).
        window: Window | None = None
        window_key: str | None = None
        rest = []
        for g in gexprs:
            if _window_call(g):
                if window is not None:
                    raise self.err("only one window per GROUP BY", g)
                window, resolved = self._window(g, rel)
                window_key = ir.key(resolved)
            else:
                rest.append(g)
        # the names the window column answers to: Spark's (`session_window` for a session
        # window), and `window`, which scripts written for Theseus use for every kind
        self.window_names = ("window", "session_window") if window is not None and \
            window.type == "session" else ("window",)
        # 2. The SELECT list, resolved against the input (aggregates stay in place for now).
        resolved_items: list[tuple[exp.Expression, str | None, exp.Expression]] = []
        for item in items:
            if isinstance(item, exp.Star) or \
                    (isinstance(item, exp.Column) and isinstance(item.this, exp.Star)):
                raise self.err("SELECT * cannot be used with GROUP BY or aggregates: list "
                               "the grouping columns and aggregates", item)
            alias = item.alias if isinstance(item, exp.Alias) else None
            raw = _unparen(item.this if isinstance(item, exp.Alias) else item)
            e = self.resolve(raw, rel.cols, "SELECT", aggregates=True,
                             window=window is not None)
            resolved_items.append((item, alias, e))
        # 3. The grouping keys, named after the SELECT item that shows them.
        groups: list[tuple[str, exp.Expression]] = []
        gmap: dict[str, str] = {}
        for g in rest:
            e = self._group_expr(g, rel, resolved_items)
            k = ir.key(e)
            if k in gmap:
                continue
            name = next((alias for _i, alias, ie in resolved_items
                         if alias and ir.key(ie) == k), None) or self._auto_name(e, rel)
            gmap[k] = name
            groups.append((name, e))
        if window_key is not None:
            gmap[window_key] = "window"
        # 4. Aggregate calls, named after their alias when a SELECT item is just the call.
        aggs: dict[str, AggCall] = {}
        preferred: dict[str, str] = {}
        for _item, alias, e in resolved_items:
            if _is_agg(e) and alias and ir.key(e) not in preferred:
                preferred[ir.key(e)] = alias
        taken = {n.lower() for n, _e in groups} | (set(self.window_names) if window
                                                   else set())

        def extract(e: exp.Expression) -> exp.Expression:
            return self._extract_aggs(e, aggs, preferred, taken, rel)

        outputs: list[tuple[str, exp.Expression, exp.Expression]] = []
        for item, alias, e in resolved_items:
            name = alias or (e.meta.get(_WINDOW_NAME) if isinstance(e, exp.Column) else None) \
                or self._auto_name(e, rel)
            rewritten = _regroup(extract(e), gmap)
            self._check_grouped(rewritten, "SELECT")
            outputs.append((name, rewritten, item))
        hpred = None
        if having is not None:
            by_name = {n.lower(): e for n, e, _i in outputs}
            hres = self.resolve(having.this, rel.cols, "HAVING", aggregates=True,
                                window=window is not None, prefer=by_name)
            hpred = _regroup(extract(hres), gmap)
            self._check_grouped(hpred, "HAVING")
        if not aggs:
            raise self.err("a GROUP BY needs at least one aggregate function in SELECT or "
                           "HAVING (for distinct rows use SELECT DISTINCT)", group or s)
        aid = self.new_id("aggregate")
        self.graph.add(Aggregate(id=aid, inputs=(rel.id,),
                                 group_by=tuple(NamedExpr(n, ir.sql(e)) for n, e in groups),
                                 aggregates=tuple(aggs.values()), window=window),
                       span_of(group) or _select_list_span(s))
        arel = Rel(aid, [ScopeCol(None, n, n) for n in self.graph.columns(aid)])
        if hpred is not None:
            hid = self.new_id("having")
            self.graph.add(Filter(id=hid, inputs=(aid,), predicate=ir.sql(hpred)),
                           span_of(having.this))
            arel = Rel(hid, arel.cols)
        result = self._project(arel, outputs, s)
        # The sink's default key: the GROUP BY columns, as the output names them.
        keys, missing = [], []
        for name, _e in groups:
            shown = next((n for n, e, _i in outputs if ir.bare_column(e) == name), None)
            if shown is None:
                missing.append(name)
            else:
                keys.append(shown)
        self.group_keys, self.missing_keys = keys, missing
        return result

    def _window(self, g: exp.Expression, rel: Rel) -> tuple[Window, exp.Expression]:
        fn = g.name.lower()
        args = g.expressions
        resolved = self.resolve(g, rel.cols, "GROUP BY")
        col = ir.bare_column(resolved.expressions[0]) if resolved.expressions else None
        if col is None:
            raise self.err(f"{fn}() takes a timestamp column first", g)
        texts = [_duration_text(a) for a in args[1:]]
        for a, t in zip(args[1:], texts):
            if t is None or duration_seconds(t) is None:
                raise self.err(f"{fn}() takes durations such as '10 minutes'", a)
        if fn == "session_window":
            if len(texts) != 1:
                raise self.err("session_window(ts, gap) takes a column and a gap", g)
            return Window("session", col, texts[0], gap=texts[0]), resolved
        if len(texts) == 1:
            return Window("tumbling", col, texts[0]), resolved
        if len(texts) == 2:
            return Window("hopping", col, texts[0], slide=texts[1]), resolved
        raise self.err("window(ts, size[, slide]) is supported; a start time is not", g)

    def _group_expr(self, g: exp.Expression, rel: Rel,
                    items: list[tuple[exp.Expression, str | None, exp.Expression]]
                    ) -> exp.Expression:
        if isinstance(g, exp.Literal) and not g.is_string:
            try:
                i = int(g.this)
            except ValueError:
                i = 0
            if not 1 <= i <= len(items):
                raise self.err(f"GROUP BY position {g.this} is not in the SELECT list "
                               f"(1 to {len(items)})", g)
            e = items[i - 1][2]
            if _has_agg(e):
                raise self.err("GROUP BY position refers to an aggregate", g)
            return e
        if isinstance(g, exp.Column) and not g.table:
            # Spark groups by a SELECT alias when no input column has that name.
            if not any(c.name.lower() == g.name.lower() for c in rel.cols):
                for _item, alias, e in items:
                    if alias and alias.lower() == g.name.lower():
                        if _has_agg(e):
                            raise self.err(f"cannot GROUP BY '{alias}': it is an aggregate",
                                           g)
                        return e
        e = self.resolve(g, rel.cols, "GROUP BY")
        return e

    def _extract_aggs(self, e: exp.Expression, aggs: dict[str, AggCall],
                      preferred: dict[str, str], taken: set[str], rel: Rel) -> exp.Expression:
        def swap(node: exp.Expression) -> exp.Expression:
            if not _is_agg(node):
                return node
            for inner in node.walk():
                if inner is not node and _is_agg(inner):
                    raise self.err("aggregate functions cannot be nested", inner)
            k = ir.key(node)
            call = aggs.get(k)
            if call is None:
                call = self._agg_call(node, k, preferred, taken, rel)
                aggs[k] = call
            out = ir.col(call.name)
            out.meta[_AGG_OUT] = True
            return out

        return e.copy().transform(swap, copy=False)

    def _agg_call(self, node: exp.Expression, k: str, preferred: dict[str, str],
                  taken: set[str], rel: Rel) -> AggCall:
        text = node.sql(dialect=ir.DIALECT)
        fname = (node.name if isinstance(node, exp.Anonymous) else text.split("(")[0]).lower()
        fname = {"mean": "avg", "std": "stddev"}.get(fname, fname)
        if fname not in E.AGGREGATE_FUNCTIONS:
            raise self.err(f"aggregate function {fname}() is not supported" +
                           did_you_mean(fname, E.AGGREGATE_FUNCTIONS), node)
        if isinstance(node, exp.Anonymous):
            values = list(node.expressions)
        else:
            values = []
            for arg in node.arg_types:
                v = node.args.get(arg)
                if isinstance(v, exp.Expression):
                    values.append(v)
                elif isinstance(v, list):
                    values.extend(x for x in v if isinstance(x, exp.Expression))
        distinct = False
        if values and isinstance(values[0], exp.Distinct):
            distinct = True
            values = list(values[0].expressions) + values[1:]
        name = preferred.get(k)
        if name is None or name.lower() in taken:
            base = self._auto_name(node, rel)
            name, n = base, 1
            while name.lower() in taken:
                n += 1
                name = f"{base}_{n}"
        taken.add(name.lower())
        return AggCall(name, fname, tuple("*" if isinstance(v, exp.Star) else ir.sql(v)
                                          for v in values), distinct)

    def _check_grouped(self, e: exp.Expression, clause: str) -> None:
        for c in e.find_all(exp.Column):
            if not c.meta.get(_AGG_OUT):
                raise self.err(f"column '{c.name}' in {clause} is neither in GROUP BY nor "
                               "inside an aggregate function", c.meta.get("span") or c)

    # -- ROW_NUMBER(): Top-N and deduplication ------------------------------------------------

    def _rank_pattern(self, s: exp.Select) -> _RankPattern | None:
        frm = s.args["from_"].this
        if s.args.get("joins") or s.args.get("laterals") or not isinstance(frm, exp.Subquery):
            return None
        inner = frm.this
        while isinstance(inner, exp.Subquery):
            inner = inner.this
        if not isinstance(inner, exp.Select):
            return None
        ranked = [i for i in inner.expressions
                  if isinstance(i, exp.Alias) and isinstance(i.this, exp.Window)]
        if not ranked:
            return None
        if len(ranked) > 1:
            raise self.err("only one ROW_NUMBER() per query", ranked[1])
        item = ranked[0]
        w = item.this
        if not isinstance(w.this, exp.RowNumber):
            raise self.err(f"{w.this.sql(dialect=ir.DIALECT)} OVER (...) is not supported: "
                           "the Top-N pattern uses ROW_NUMBER()", w.this)
        rn = item.alias
        bound, rest = None, []
        for c in ir.conjuncts(s.args["where"].this if s.args.get("where") else None):
            n = _rank_bound(c, rn)
            if n is None:
                rest.append(c)
            elif bound is not None:
                raise self.err(f"'{rn}' is bounded twice", c)
            else:
                if n < 1:
                    raise self.err(f"the bound on '{rn}' keeps no rows", c)
                bound = n
        if bound is None:
            raise self.err(f"ROW_NUMBER() needs a bound in the outer WHERE: {rn} <= N "
                           f"(or {rn} = 1)", s.args.get("where") or s)
        return _RankPattern(inner, item, rn, bound, rest, frm.alias or None)

    def _select_ranked(self, s: exp.Select, p: _RankPattern, ctes: dict,
                       hints: _Hints) -> Rel:
        for k in ("group", "having"):
            if s.args.get(k):
                raise self.err("GROUP BY or HAVING over the Top-N pattern is not supported "
                               "(top_n retracts rows, which Spark cannot aggregate)", s.args[k])
        inner = p.inner
        self._refuse_clauses(inner)
        for k in ("group", "having"):
            if inner.args.get(k):
                raise self.err("ROW_NUMBER() over a GROUP BY is not supported (top_n needs "
                               "an insert-only input)", inner.args[k])
        if inner.args.get("distinct"):
            raise self.err("SELECT DISTINCT with ROW_NUMBER() is not supported",
                           inner.args["distinct"])
        rel = self.from_where(inner, ctes)
        w = p.item.this
        if w.args.get("spec"):
            raise self.err("a window frame is not supported with ROW_NUMBER()", w.args["spec"])
        order = w.args.get("order")
        if order is None or not order.expressions:
            raise self.err("ROW_NUMBER() needs ORDER BY in its OVER (...)", w)
        parts = [self.resolve(x, rel.cols, "PARTITION BY")
                 for x in w.args.get("partition_by") or []]
        orders = [(self.resolve(o.this, rel.cols, "ORDER BY"), bool(o.args.get("desc")))
                  for o in order.expressions]
        marks = self.graph.watermarks(rel.id)
        first = ir.bare_column(orders[0][0]) if len(orders) == 1 else None
        dedup = p.n == 1 and first is not None and not orders[0][1] and \
            first.lower() in marks and parts and all(ir.bare_column(x) for x in parts)
        if dedup:
            sid = self.new_id("dedup")
            keys = tuple(ir.bare_column(x) or "" for x in parts)
            self.graph.add(Deduplicate(id=sid, inputs=(rel.id,), keys=keys,
                                       within=hints.dedup_within), span_of(p.item))
        else:
            if hints.dedup_within:
                raise self.err("DEDUP_WITHIN applies to deduplication: ROW_NUMBER() OVER "
                               "(PARTITION BY <keys> ORDER BY <event-time column>) with "
                               f"{p.rn} = 1", hints.span)
            sid = self.new_id("top_n")
            self.graph.add(TopN(id=sid, inputs=(rel.id,),
                                partition_by=tuple(ir.sql(x) for x in parts),
                                order_by=tuple(OrderKey(ir.sql(e), d) for e, d in orders),
                                n=p.n), span_of(p.item))
        rel = Rel(sid, rel.cols)
        inner_items = [i for i in inner.expressions if i is not p.item]
        self._refuse_rank_refs(inner_items, p.rn, inner)
        rel = self.project(rel, inner_items, inner).requalify(p.alias)
        self.group_keys, self.missing_keys = None, []
        self._refuse_rank_refs(list(s.expressions) + p.rest, p.rn, s)
        if p.rest:
            rel = self.filter(rel, ir.and_all(p.rest), "WHERE", "where")
        rel = self.project(rel, list(s.expressions), s)
        if s.args.get("distinct"):
            raise self.err("SELECT DISTINCT over ROW_NUMBER() is not supported",
                           s.args["distinct"])
        return rel

    def _refuse_rank_refs(self, items: list[exp.Expression], rn: str,
                          where: exp.Expression) -> None:
        for item in items:
            for c in item.find_all(exp.Column):
                if not c.table and c.name.lower() == rn.lower():
                    raise self.err(f"the row number '{rn}' is not an output column: the "
                                   "top_n and deduplicate steps keep rows, not their rank "
                                   f"(use '{rn}' only in the outer WHERE bound)", c)

    # -- column resolution ------------------------------------------------------------------

    def resolve(self, e: exp.Expression, cols: list[ScopeCol], clause: str, *,
                aggregates: bool = False, window: bool = False,
                prefer: dict[str, exp.Expression] | None = None,
                span: Span | None = None) -> exp.Expression:
        """A copy of ``e`` with every column replaced by its step output name.

        In a join's ON clause columns carry ``ir.LEFT``/``ir.RIGHT`` as their table.
        ``prefer`` maps names (HAVING: the SELECT list's output names) that win over input
        columns; ``window`` makes ``window`` name the aggregate's window column.
        """
        def fix(node: exp.Expression) -> exp.Expression:
            if isinstance(node, (exp.Column, exp.Dot)):
                parts = _parts(node)
                if parts is not None:
                    return self._column(parts, node, cols, clause, window, prefer, span)
            if isinstance(node, (exp.Subquery, exp.Exists)) or \
                    (isinstance(node, exp.Select) and node is not e):
                raise self.err(f"subqueries in {clause} are not supported", node)
            if isinstance(node, exp.Window):
                raise self.err(f"window functions are not supported in {clause}", node)
            if not aggregates and _is_agg(node):
                raise self.err(f"aggregate function {_fname(node)}() is not allowed in "
                               f"{clause}", node)
            if isinstance(node, exp.Star) and not isinstance(node.parent, exp.Count):
                raise self.err(f"* is not allowed in {clause}", node)
            return node

        return e.copy().transform(fix, copy=False)

    def _column(self, parts: list[exp.Identifier], node: exp.Expression,
                cols: list[ScopeCol], clause: str, window: bool,
                prefer: dict[str, exp.Expression] | None, span: Span | None
                ) -> exp.Expression:
        names = [p.name for p in parts]
        where = span or span_of(node)
        if prefer and len(names) == 1 and names[0].lower() in prefer:
            return prefer[names[0].lower()].copy()
        base: ScopeCol | None = None
        fields: list[str] = []
        if len(names) >= 2:
            q = names[0].lower()
            qualified = [c for c in cols if c.qualifier == q]
            if qualified:
                match = [c for c in qualified if c.name.lower() == names[1].lower()]
                if not match:
                    raise self.err(f"unknown column '{names[1]}' in table '{names[0]}' in "
                                   f"{clause}" + did_you_mean(names[1],
                                                               [c.name for c in qualified]),
                                   span_of(parts[1]) or where)
                base, fields = match[0], names[2:]
        if base is None:
            match = [c for c in cols if c.name.lower() == names[0].lower()]
            distinct = {(c.side, c.physical.lower()) for c in match}
            if len(distinct) > 1:
                quals = sorted({f"{c.qualifier}.{c.name}" for c in match if c.qualifier})
                raise self.err(f"column '{names[0]}' in {clause} is ambiguous" +
                               (f": write {' or '.join(quals)}" if quals else ""), where)
            if match:
                base, fields = match[0], names[1:]
        if base is None:
            if window and names[0].lower() in self.window_names:
                out: exp.Expression = ir.col("window")
                out.meta[_AGG_OUT] = True
                out.meta[_WINDOW_NAME] = names[0].lower()  # the output's name, unaliased
                for f in names[1:]:
                    out = exp.Dot(this=out, expression=ir.ident(f))
                out.meta["span"] = where
                return out
            candidates = [c.name for c in cols] + \
                [f"{c.qualifier}.{c.name}" for c in cols if c.qualifier]
            shown = ".".join(names)
            raise self.err(f"unknown column '{shown}' in {clause}" +
                           did_you_mean(shown, candidates), where)
        out = ir.col(base.physical, base.side)
        out.meta["span"] = where
        for f in fields:
            out = exp.Dot(this=out, expression=ir.ident(f))
        return out

    def _auto_name(self, e: exp.Expression, rel: Rel) -> str:
        """The name Spark gives an unaliased expression (near enough: alias to choose)."""
        if isinstance(e, exp.Column) and not e.table:
            # the name as declared, whatever case the query wrote it in
            return next((c.name for c in rel.cols if c.physical == e.name), e.name)
        if isinstance(e, exp.Dot):
            return e.expression.name
        if isinstance(e, exp.Count) and isinstance(e.this, exp.Star):
            return "count(1)"
        text = e.sql(dialect=ir.DIALECT, normalize_functions="lower")
        if isinstance(e, (exp.Binary, exp.Unary, exp.Predicate)) and \
                not isinstance(e, exp.Func):
            text = f"({text})"
        return text


@dataclass
class _RankPattern:
    inner: exp.Select
    item: exp.Alias
    rn: str
    n: int
    rest: list[exp.Expression]
    alias: str | None


# -- helpers ------------------------------------------------------------------------------------


def _parts(node: exp.Expression) -> list[exp.Identifier] | None:
    """Identifiers of a column reference ``a.b.c`` (None when it is not one)."""
    if isinstance(node, exp.Column):
        if isinstance(node.this, exp.Star):
            return None
        if node.table in (ir.LEFT, ir.RIGHT):
            return None  # already resolved
        return [p for p in node.parts if isinstance(p, exp.Identifier)]
    if isinstance(node, exp.Dot) and isinstance(node.expression, exp.Identifier):
        inner = _parts(node.this) if isinstance(node.this, (exp.Column, exp.Dot)) else None
        return inner + [node.expression] if inner else None
    return None


def _unparen(e: exp.Expression) -> exp.Expression:
    """Parentheses around a whole SELECT item mean nothing (Spark drops them)."""
    while isinstance(e, exp.Paren):
        e = e.this
    return e


def _unqualify(e: exp.Expression) -> exp.Expression:
    e = e.copy()
    for c in e.find_all(exp.Column):
        c.set("table", None)
    return e


def _sides(e: exp.Expression) -> set[str]:
    return {c.table for c in e.find_all(exp.Column) if c.table in (ir.LEFT, ir.RIGHT)}


def _is_comma(j: exp.Join) -> bool:
    """``FROM a, b`` (sqlglot reads it as ``a CROSS JOIN b``): joined on WHERE's keys."""
    return (j.kind or "").upper() == "CROSS" and not j.side and not j.method and \
        j.args.get("on") is None and not j.args.get("using")


def _in_scope(e: exp.Expression, cols: list[ScopeCol]) -> bool:
    """Whether every column ``e`` names is one of ``cols`` (by qualifier or name)."""
    quals = {c.qualifier for c in cols} - {None}
    names = {c.name.lower() for c in cols}
    for c in e.find_all(exp.Column):
        parts = _parts(c)
        if not parts:
            continue
        first = parts[0].name.lower()
        if not ((len(parts) >= 2 and first in quals) or first in names):
            return False
    return True


def _pairs_sides(e: exp.Expression) -> bool:
    """An equality of an expression of one join side with one of the other."""
    if not isinstance(e, exp.EQ):
        return False
    a, b = _sides(e.this), _sides(e.expression)
    return {frozenset(a), frozenset(b)} == {frozenset({ir.LEFT}), frozenset({ir.RIGHT})}


def _event_time_range(e: exp.Expression, marks: dict[str, set[str]]) -> bool:
    """A range between both join sides that reads an event-time column of each."""
    if not isinstance(e, (exp.Between, exp.LT, exp.LTE, exp.GT, exp.GTE)):
        return False
    read = {(c.table, c.name.lower()) for c in e.find_all(exp.Column)}
    return all(any((side, m) in read for m in marks[side]) for side in (ir.LEFT, ir.RIGHT))


def _is_agg(node: exp.Expression) -> bool:
    if isinstance(node, exp.AggFunc):
        return True
    return isinstance(node, exp.Anonymous) and node.name.lower() in E.AGGREGATE_FUNCTIONS


def _fname(node: exp.Expression) -> str:
    return (node.name if isinstance(node, exp.Anonymous) else
            node.sql(dialect=ir.DIALECT).split("(")[0]).lower()


def _has_agg(e: exp.Expression) -> bool:
    return any(_is_agg(n) for n in e.walk())


def _generator(item: exp.Expression) -> exp.Expression | None:
    e = item.this if isinstance(item, exp.Alias) else item
    if isinstance(e, (exp.Explode, exp.ExplodeOuter, exp.Posexplode, exp.Inline)):
        return e
    return None


def _window_call(g: exp.Expression) -> bool:
    return isinstance(g, exp.Anonymous) and g.name.lower() in ("window", "session_window")


def _duration_text(e: exp.Expression) -> str | None:
    if isinstance(e, exp.Literal) and e.is_string:
        return e.this.strip()
    if isinstance(e, exp.Interval):
        value = e.this.this if isinstance(e.this, exp.Literal) else None
        unit = e.args.get("unit")
        if value is not None and unit is not None:
            return f"{value} {unit.name.lower()}"
        if value is not None:
            return str(value).strip()
    return None


def _regroup(e: exp.Expression, gmap: dict[str, str]) -> exp.Expression:
    """Replace grouping expressions (largest first) by the aggregate's output columns."""
    if e.meta.get(_AGG_OUT):
        return e
    if not isinstance(e, (exp.Identifier, exp.Literal)):
        name = gmap.get(ir.key(e))
        if name is not None:
            out = ir.col(name)
            out.meta[_AGG_OUT] = True
            return out
    for k, v in list(e.args.items()):
        if isinstance(v, exp.Expression):
            e.set(k, _regroup(v, gmap))
        elif isinstance(v, list):
            e.set(k, [_regroup(x, gmap) if isinstance(x, exp.Expression) else x for x in v])
    return e


def _rank_bound(c: exp.Expression, rn: str) -> int | None:
    def is_rn(x: exp.Expression) -> bool:
        return isinstance(x, exp.Column) and not x.table and x.name.lower() == rn.lower()

    def num(x: exp.Expression) -> int | None:
        if isinstance(x, exp.Literal) and not x.is_string:
            try:
                return int(x.this)
            except ValueError:
                return None
        return None

    if isinstance(c, exp.Between) and is_rn(c.this) and num(c.args["low"]) == 1:
        return num(c.args["high"])
    if not isinstance(c, (exp.LT, exp.LTE, exp.EQ, exp.GT, exp.GTE)):
        return None
    a, b = c.this, c.expression
    if is_rn(b) and not is_rn(a):
        a, b = b, a
        c = {exp.LT: exp.GT, exp.LTE: exp.GTE, exp.GT: exp.LT, exp.GTE: exp.LTE,
             exp.EQ: exp.EQ}[type(c)](this=a, expression=b)
    if not is_rn(a) or num(b) is None:
        return None
    n = num(b)
    assert n is not None
    if isinstance(c, exp.LTE):
        return n
    if isinstance(c, exp.LT):
        return n - 1
    if isinstance(c, exp.EQ) and n == 1:
        return 1
    return None


def _enclosing_select(node: exp.Expression) -> exp.Expression | None:
    p = node.parent
    while p is not None and not isinstance(p, exp.Select):
        p = p.parent
    return p


def _select_list_span(s: exp.Select) -> Span | None:
    spans = [sp for sp in (span_of(i) for i in s.expressions) if sp]
    if not spans:
        return span_of(s)
    return min(a for a, _ in spans), max(b for _, b in spans)


def _qualified(e: exp.Expression | None, inputs: tuple[str, str]) -> str | None:
    """A join condition's text, its ``LEFT``/``RIGHT`` columns qualified by the input ids."""
    if e is None:
        return None
    names = {ir.LEFT: inputs[0], ir.RIGHT: inputs[1]}
    out = e.copy()
    for c in out.find_all(exp.Column):
        if c.table in names:
            c.set("table", ir.ident(names[c.table]))
    return ir.sql(out)


def plan_error(src: SqlText, script: Script, graph: ir.Graph, e: PlanError) -> SqlError:
    """A step the plan's validation refuses, reported at the SQL that produced it."""
    step = graph.steps.get(e.node or "")
    what = f"{step.step} '{step.id}'" if step else "the plan"
    if step is None and e.node:  # a step inside a recursive step's body
        for rec in graph.steps.values():
            inner = next((b for b in getattr(rec, "body", ()) if b.id == e.node), None)
            if inner is not None:
                what = f"{inner.step} '{inner.id}' in the body of recursive '{rec.id}'"
                break
    text = e.message
    if e.expected is not None or e.found is not None:
        text += f" (expected {e.expected}, found {e.found})"
    if e.hint:
        text += f". {e.hint}"
    if step is not None and step.step == "sink" and "key_columns" in (e.pointer or ""):
        text += f"; set OPTIONS (key '<column>[,<column>...]') on table '{step.id}'"
    where = graph.origins.get(e.node or "") or script.query_span
    return src.error(f"the compiled plan is invalid at {what}: {text}", where)


def translate(src: SqlText, script: Script) -> tuple[ir.Graph, Output]:
    """The graph of the script's query, without its sink (the caller adds it)."""
    t = Translator(src, script)
    assert script.query is not None
    out = t.translate(script.query)
    return t.graph, out


__all__ = ["HINTS", "Output", "Rel", "ScopeCol", "Translator", "translate"]
