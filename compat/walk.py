"""The lockstep walk: from both sinks upward, enforcing step by enforcing step.

From an enforcing node, each input is followed through passive nodes to the nearest
enforcing nodes (its *frontier*).  Old and new frontiers are paired input by input, the
passive paths between them are aligned, the pairs are compared by their rules, and the walk
recurses.  A structural (Merkle) hash per node lets the walk skip identical subtrees without
parsing a single expression: only their alignment is recorded.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field

from compat import expr as E
from compat.findings import Finding
from compat.model import ENFORCING, Node, Plan
from compat.rules import RuleContext
from compat.rules.passive import check_passive
from compat.steps import Explode, Filter, Project, Source, StartGate, StopGate, Union

Rule = Callable[[Node, Node, RuleContext], list[Finding]]
_GATES = (StopGate, StartGate)


def merkle(plan: Plan, memo: dict[int, int] | None = None) -> dict[str, int]:
    """Structural hash of every node's subtree: equal hashes mean equal computations.

    ``memo`` caches each node object's content hash; the two sides of a check share the
    node objects whose documents are equal, so each is hashed once.
    """
    memo = {} if memo is None else memo
    out: dict[str, int] = {}
    for nid, node in plan.nodes.items():  # topological order: inputs first
        if isinstance(node, _GATES):  # gates are deployment plumbing, not computation
            out[nid] = out[node.inputs[0]]
            continue
        h = memo.get(id(node))
        if h is None:
            h = memo[id(node)] = hash((node.step, node.content()))
        out[nid] = hash((h, *[out[i] for i in node.inputs]))
    return out


@dataclass
class Walk:
    old: Plan
    new: Plan
    ctx: RuleContext
    rules: dict[str, list[Rule]]
    findings: list[Finding] = field(default_factory=list)
    alignment: list[tuple[str, str, str]] = field(default_factory=list)
    _seen: set[tuple[str, str]] = field(default_factory=set)

    def run(self) -> None:
        memo: dict[int, int] = {}
        self.ho, self.hn = merkle(self.old, memo), merkle(self.new, memo)
        self.memo = memo
        self.visit(self.old.sink, self.new.sink)

    # ------------------------------------------------------------------------------------
    def visit(self, o: Node, n: Node) -> None:
        key = (o.id, n.id)
        if key in self._seen:
            return
        self._seen.add(key)
        self.alignment.append((o.id, n.id, n.step if o.step == n.step else
                               f"{o.step}->{n.step}"))
        if self.ho[o.id] == self.hn[n.id]:
            self._align_identical(o, n)
            return
        if o.step != n.step:
            self.findings.append(self.ctx.f(
                "step-type-changed", f"enforcing step '{o.id}' ({o.step}) is paired with "
                f"'{n.id}' ({n.step}): a different stateful operator", o, n, "step"))
        else:
            for rule in self.rules.get(n.step, ()):
                self.findings.extend(rule(o, n, self.ctx))
        if isinstance(o, Source) or isinstance(n, Source):
            return
        stateful = self.old.info[o.id].stateful or self.new.info[n.id].stateful
        n_inputs = max(len(o.inputs), len(n.inputs))
        if len(o.inputs) != len(n.inputs):
            self.findings.append(self.ctx.f(
                "frontier-changed", f"'{n.id}' has {len(n.inputs)} input(s), '{o.id}' had "
                f"{len(o.inputs)}", o, n, "inputs"))
        for i in range(n_inputs):
            fo = frontier(self.old, o.inputs[i]) if i < len(o.inputs) else []
            fn = frontier(self.new, n.inputs[i]) if i < len(n.inputs) else []
            self.pair_frontiers(o, n, i, fo, fn, stateful)

    def _align_identical(self, o: Node, n: Node) -> None:
        """Record matched enforcing pairs of two identical subtrees, position by position."""
        for i in range(len(o.inputs)):
            fo = frontier(self.old, o.inputs[i])
            fn = frontier(self.new, n.inputs[i])
            for (eo, _), (en, _) in zip(fo, fn):
                k = (eo, en)
                if k not in self._seen:
                    self._seen.add(k)
                    self.alignment.append((eo, en, self.new.nodes[en].step))
                    self._align_identical(self.old.nodes[eo], self.new.nodes[en])

    def pair_frontiers(self, o: Node, n: Node, idx: int, fo: list[tuple[str, list[str]]],
                       fn: list[tuple[str, list[str]]], stateful: bool) -> None:
        if len(fo) != len(fn):
            self.findings.append(self.ctx.f(
                "frontier-changed", f"input {idx} of '{n.id}' is fed by {len(fn)} enforcing "
                f"step(s) ({', '.join(e for e, _ in fn) or 'none'}), was {len(fo)} "
                f"({', '.join(e for e, _ in fo) or 'none'})", o, n, f"inputs/{idx}"))
        pairs, left_o, left_n = _pair(fo, fn, self.old, self.new, self.ho, self.hn)
        for (eo, po), (en, pn) in pairs:
            self.compare_paths(o, n, po, pn, stateful)
            self.visit(self.old.nodes[eo], self.new.nodes[en])
        # An enforcing step inserted (or dropped) between two others: the nodes behind it
        # are still there, one level further up.  Report the step alone and walk on.
        for en, pn in list(left_n):
            node = self.new.nodes[en]
            if isinstance(node, Source) or not left_o:
                continue
            behind = [x for i in node.inputs for x in frontier(self.new, i)]
            sub, left_o2, _ = _pair(left_o, behind, self.old, self.new, self.ho, self.hn,
                                    strict=True)
            if sub:
                left_n.remove((en, pn))
                left_o = left_o2
                self.findings.append(self.ctx.f(
                    "enforcing-added", f"{node.step} '{en}' is inserted before '{n.id}'; "
                    "its state has no history", o, node, "inputs", ""))
                for (eo, _po), (eb, _pb) in sub:
                    self.visit(self.old.nodes[eo], self.new.nodes[eb])
        for eo, po in list(left_o):
            node = self.old.nodes[eo]
            if isinstance(node, Source) or not left_n:
                continue
            behind = [x for i in node.inputs for x in frontier(self.old, i)]
            sub, left_b, left_n2 = _pair(behind, left_n, self.old, self.new, self.ho,
                                         self.hn, strict=True)
            if sub:
                left_o.remove((eo, po))
                left_n = left_n2
                self.findings.append(self.ctx.f(
                    "enforcing-removed", f"{node.step} '{eo}' is removed from before "
                    f"'{n.id}'", node, n, "", "inputs"))
                for (eb, _pb), (en, _pn) in sub:
                    self.visit(self.old.nodes[eb], self.new.nodes[en])
        for eo, _po in left_o:
            node = self.old.nodes[eo]
            code = "source-removed" if isinstance(node, Source) else "enforcing-removed"
            self.findings.append(self.ctx.f(code, f"{node.step} '{eo}' no longer feeds "
                                            f"'{n.id}'", node, n, "", "inputs"))
        for en, _pn in left_n:
            node = self.new.nodes[en]
            code = "source-added" if isinstance(node, Source) else "enforcing-added"
            self.findings.append(self.ctx.f(code, f"{node.step} '{en}' now feeds '{n.id}'; "
                                            "its history is not in the old state", o, node,
                                            "inputs", ""))

    def compare_paths(self, o: Node, n: Node, po: list[str], pn: list[str],
                      stateful: bool) -> None:
        """Align the passive steps between a frontier pair and its consumers."""
        memo = self.memo
        if [memo[id(self.old.nodes[x])] for x in po] == \
                [memo[id(self.new.nodes[x])] for x in pn]:
            return  # same steps, same versions, same text: nothing to compare
        ko = [_passive_key(self.old.nodes[x]) for x in po]
        kn = [_passive_key(self.new.nodes[x]) for x in pn]
        if ko == kn:
            for a, b in zip(po, pn):
                self._versions(self.old.nodes[a], self.new.nodes[b])
            return
        self.ctx.upstream_of_state = stateful
        self.ctx.consumer = (o, n)
        sm = difflib.SequenceMatcher(a=ko, b=kn, autojunk=False)
        for tag, i1, i2, j1, j2 in sm.get_opcodes():
            olds = [self.old.nodes[x] for x in po[i1:i2]]
            news = [self.new.nodes[x] for x in pn[j1:j2]]
            if tag == "equal":
                for a, b in zip(olds, news):
                    self._versions(a, b)
                continue
            # Pair same-step nodes in order; the rest were added or removed.
            for a in list(olds):
                match = next((b for b in news if b.step == a.step), None)
                if match is not None:
                    self.findings.extend(check_passive(a, match, self.ctx))
                    self._versions(a, match)
                    news.remove(match)
                else:
                    self.findings.extend(check_passive(a, None, self.ctx))
            for b in news:
                self.findings.extend(check_passive(None, b, self.ctx))
        self.ctx.upstream_of_state = False

    def _versions(self, a: Node, b: Node) -> None:
        from compat.rules.common import check_version
        self.findings.extend(check_version(a, b, self.ctx))


def _passive_key(node: Node) -> tuple:
    if isinstance(node, Filter):
        return ("filter", E.canonical(node.predicate))
    if isinstance(node, Project):
        return ("project", tuple((c.name.lower(), E.canonical(c.expr)) for c in node.columns))
    if isinstance(node, Explode):
        return ("explode", E.canonical(node.expr), node.alias.lower(), node.outer)
    if isinstance(node, Union):
        return ("union", len(node.inputs))
    return (node.step, node.content())


def frontier(plan: Plan, start: str) -> list[tuple[str, list[str]]]:
    """Enforcing nodes reached from ``start`` through passive ones, each with the passive
    path that leads to it, in flow order (the frontier node's consumer last)."""
    out: list[tuple[str, list[str]]] = []
    stack: list[tuple[str, list[str]]] = [(start, [])]
    while stack:
        nid, path = stack.pop()
        node = plan.nodes[nid]
        if node.klass == ENFORCING:
            out.append((nid, path))
            continue
        here = path if isinstance(node, _GATES) else [nid] + path
        for inp in reversed(node.inputs):
            stack.append((inp, here))
    return out


def _identity(plan: Plan, nid: str) -> tuple:
    node = plan.nodes[nid]
    if isinstance(node, Source):
        return ("source", node.topic)
    return (node.step,)


def _pair(fo, fn, old: Plan, new: Plan, ho, hn, strict: bool = False):
    """Pair frontier entries: identical subtrees first, then same identity, then same step.

    Within each key, entries pair in order; buckets keep this linear in the frontier size.
    """
    left_o = list(fo)
    left_n = list(fn)
    pairs = []
    keys = (
        (lambda x: ho[x], lambda x: hn[x]),
        (lambda x: _identity(old, x), lambda x: _identity(new, x)),
        (lambda x: old.nodes[x].step, lambda x: new.nodes[x].step),
    )
    for key_o, key_n in keys[:2] if strict else keys:
        if not left_o or not left_n:
            break
        buckets: dict[object, list[int]] = {}
        for j, en in enumerate(left_n):
            buckets.setdefault(key_n(en[0]), []).append(j)
        taken: set[int] = set()
        rest_o = []
        for eo in left_o:
            cands = buckets.get(key_o(eo[0]))
            if cands:
                j = cands.pop(0)
                taken.add(j)
                pairs.append((eo, left_n[j]))
            else:
                rest_o.append(eo)
        left_o = rest_o
        left_n = [en for j, en in enumerate(left_n) if j not in taken]
    return pairs, left_o, left_n
