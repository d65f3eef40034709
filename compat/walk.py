"""The lockstep walk: from both sinks upward, enforcing step by enforcing step.

From an enforcing node, each input is followed through passive nodes to the nearest
enforcing nodes (its *frontier*).  Old and new frontiers are paired input by input, the
passive paths between them are aligned, the pairs are compared by their rules, and the walk
goes on behind them.  A structural (Merkle) hash per node lets the walk skip identical
subtrees without parsing a single expression: only their alignment is recorded.

Every phase is linear in the plans (n·log n at worst, in the alignment of passive paths):
a frontier's paths are built from parent links rather than copied at every step; passive
paths are aligned by anchoring on unique equal steps (see ``align``) rather than by
``difflib``; expressions are put in canonical form only where two paths differ; unpaired
enforcing steps are looked up in indexes, not compared with each other; and the walk keeps
its own stack, so a long chain of stateful steps cannot exhaust Python's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from compat.findings import RESTART, Finding
from compat.model import ENFORCING, Node, Plan
from compat.rules import RuleContext
from compat.rules.common import check_version
from compat.rules.passive import check_passive, history_note
from compat.steps import Sink, Source, StartGate, StopGate
from compat.steps.source import SNAPSHOT, table_read

Rule = Callable[[Node, Node, RuleContext], list[Finding]]
#: an old and a new enforcing step paired by the walk
Pair = tuple[Node, Node]
#: a step of the walk: yields the walks of the pairs behind it (see ``Walk.visit``)
Steps = Iterator["Steps"]
_GATES = (StopGate, StartGate)
_RAW_FIELDS: dict[type, tuple[str, ...]] = {}


def merkle(plan: Plan, memo: dict[int, int] | None = None,
           content: Callable[[Node], Hashable] | None = None) -> dict[str, int]:
    """Structural hash of every node's subtree: equal hashes mean equal computations.

    ``memo`` caches each node object's content hash; the two sides of a check share the
    node objects whose documents are equal, so each is hashed once.  ``content`` gives
    what a node computes (by default its step and ``content()``).
    """
    memo = {} if memo is None else memo
    out: dict[str, int] = {}
    gate: dict[type, bool] = {}
    for nid, node in plan.nodes.items():  # topological order: inputs first
        cls = node.__class__
        is_gate = gate.get(cls)
        if is_gate is None:
            is_gate = gate[cls] = issubclass(cls, _GATES)
        if is_gate:  # gates are deployment plumbing, not computation
            out[nid] = out[node.inputs[0]]
            continue
        h = memo.get(id(node))
        if h is None:
            h = memo[id(node)] = hash(content(node) if content is not None else
                                      (node.step, node.content()))
        ins = node.inputs
        out[nid] = hash((h, out[ins[0]]) if len(ins) == 1 else
                        (h, *[out[i] for i in ins]))
    return out


@dataclass
class Walk:
    old: Plan
    new: Plan
    ctx: RuleContext
    rules: dict[str, list[Rule]]
    findings: list[Finding] = field(default_factory=list)
    alignment: list[tuple[str, str, str]] = field(default_factory=list)
    #: passive steps paired as the paths between matched enforcing steps are aligned
    #: (old id, new id, step), recorded only when a list is given (``plan diff`` asks)
    passive: list[tuple[str, str, str]] | None = None
    _seen: set[tuple[str, str]] = field(default_factory=set)
    #: raw key number of each node object, and the numbers by raw key
    _raw: dict[int, int] = field(default_factory=dict)
    _raw_keys: dict[tuple, int] = field(default_factory=dict)

    def run(self) -> None:
        memo: dict[int, int] = {}
        self.ho = self._merkle(self.old, memo)
        self.hn = self._merkle(self.new, memo)
        self.memo = memo
        self.visit(self.old.sink, self.new.sink)

    def _merkle(self, plan: Plan, memo: dict[int, int]) -> dict[str, int]:
        """``merkle(plan, memo, content)`` where a node's content is its raw key and its
        version (``(self._raw_key(node), node.version)``), written out: the same hashes
        and raw key numbers, without two calls per node."""
        out: dict[str, int] = {}
        gate: dict[type, bool] = {}
        raw = self._raw
        raw_keys = self._raw_keys
        for nid, node in plan.nodes.items():  # topological order: inputs first
            cls = node.__class__
            is_gate = gate.get(cls)
            if is_gate is None:
                is_gate = gate[cls] = issubclass(cls, _GATES)
            if is_gate:
                out[nid] = out[node.inputs[0]]
                continue
            h = memo.get(id(node))
            if h is None:
                k = raw.get(id(node))
                if k is None:
                    names = _RAW_FIELDS.get(cls)
                    if names is None:
                        k = self._raw_key(node)
                    else:
                        key = (node.step, len(node.inputs),
                               *[getattr(node, f) for f in names])
                        k = raw[id(node)] = raw_keys.setdefault(key, len(raw_keys))
                h = memo[id(node)] = hash((k, node.version))
            ins = node.inputs
            out[nid] = hash((h, out[ins[0]]) if len(ins) == 1 else
                            (h, *[out[i] for i in ins]))
        return out

    # ------------------------------------------------------------------------------------
    def visit(self, o: Node, n: Node, state: Pair | None = None) -> None:
        """Walk from the pair ``o``, ``n`` upward, depth first; ``state`` is the nearest
        stateful pair downstream of it (None below the sink).

        Each step of the walk is a generator that yields the walks of the pairs behind it
        where it used to call itself: a stack of them walks in the same order as the
        recursion did, however many stateful steps a plan chains.
        """
        stack: list[Iterator[Steps]] = [self._visit(o, n, state)]
        while stack:
            child = next(stack[-1], None)
            if child is None:
                stack.pop()
            else:
                stack.append(child)

    def _visit(self, o: Node, n: Node, state: Pair | None) -> Steps:
        key = (o.id, n.id)
        if key in self._seen:
            return
        self._seen.add(key)
        self.alignment.append((o.id, n.id, n.step if o.step == n.step else
                               f"{o.step}->{n.step}"))
        if self.ho[o.id] == self.hn[n.id]:
            self._identical_state(o, n)
            yield self._align_identical(o, n)
            return
        stateful = self.old.info[o.id].stateful or self.new.info[n.id].stateful
        if o.step != n.step:
            self.findings.append(self.ctx.f(
                "step-type-changed", f"enforcing step '{o.id}' ({o.step}) is paired with "
                f"'{n.id}' ({n.step}): a different stateful operator", o, n, "step"))
        else:
            found: list[Finding] = []
            for rule in self.rules.get(n.step, ()):
                found.extend(rule(o, n, self.ctx))
            if not stateful and _checkpoint_free(o) and _checkpoint_free(n):
                found = [self._stateless(f, state) for f in found]
            self.findings.extend(found)
        if isinstance(o, Source) or isinstance(n, Source):
            return
        # What changes upstream of here is upstream of this pair's state, or of the state
        # downstream of it: a step that holds none is transparent to history.
        state = (o, n) if stateful else state
        n_inputs = max(len(o.inputs), len(n.inputs))
        if len(o.inputs) != len(n.inputs):
            self.findings.append(self.ctx.f(
                "frontier-changed", f"'{n.id}' has {len(n.inputs)} input(s), '{o.id}' had "
                f"{len(o.inputs)}", o, n, "inputs"))
        for i in range(n_inputs):
            fo = frontier(self.old, o.inputs[i]) if i < len(o.inputs) else []
            fn = frontier(self.new, n.inputs[i]) if i < len(n.inputs) else []
            yield from self.pair_frontiers(o, n, i, fo, fn, state)

    def _stateless(self, f: Finding, state: Pair | None) -> Finding:
        """A change of an enforcing step that holds no state (a stream-table join) is
        judged as a passive change is: a restart suffices, and upstream of state history
        stays computed the old way.  A version change keeps its own judgement."""
        if f.code == "step-version-changed" or f.effect not in ("in_place", "migrate"):
            return f
        s = _state_node(state)
        note = history_note(s) if s is not None else ""
        return replace(f, effect="in_place", severity="warning" if f.effect == "migrate"
                       else f.severity, history=s is not None,
                       message=f.message if note in f.message else f.message + note)

    def _align_identical(self, o: Node, n: Node) -> Steps:
        """Record matched enforcing pairs of two identical subtrees, position by position."""
        for i in range(len(o.inputs)):
            fo = frontier(self.old, o.inputs[i])
            fn = frontier(self.new, n.inputs[i])
            for (eo, po), (en, pn) in zip(fo, fn):
                k = (eo, en)
                self._pair_passive(po, pn)
                if k not in self._seen:
                    self._seen.add(k)
                    self.alignment.append((eo, en, self.new.nodes[en].step))
                    self._identical_state(self.old.nodes[eo], self.new.nodes[en])
                    yield self._align_identical(self.old.nodes[eo], self.new.nodes[en])

    def _identical_state(self, o: Node, n: Node) -> None:
        """Two identical subtrees compute the same, but what a stateful step of theirs keeps
        in state may depend on what is read above it (Spark prunes the rest): where it
        differs, the step's rule says how."""
        if not (self.old.info[o.id].stateful and self.new.info[n.id].stateful):
            return
        if o.kept_state(self.old) == n.kept_state(self.new):
            return
        for rule in self.rules.get(n.step, ()):
            self.findings.extend(rule(o, n, self.ctx))

    def pair_frontiers(self, o: Node, n: Node, idx: int, fo: list[tuple[str, list[str]]],
                       fn: list[tuple[str, list[str]]], state: Pair | None) -> Steps:
        """Pair the enforcing steps feeding input ``idx`` of ``o``/``n``; ``state`` is the
        nearest stateful pair at or downstream of ``o``/``n``."""
        if len(fo) != len(fn):
            self.findings.append(self.ctx.f(
                "frontier-changed", f"input {idx} of '{n.id}' is fed by {len(fn)} enforcing "
                f"step(s) ({', '.join(e for e, _ in fn) or 'none'}), was {len(fo)} "
                f"({', '.join(e for e, _ in fo) or 'none'})", o, n, f"inputs/{idx}"))
        pairs, left_o, left_n = _pair(fo, fn, self.old, self.new, self.ho, self.hn)
        en_done: set[str] = set()
        for (eo, po), (en, pn) in pairs:
            self.compare_paths(o, n, po, pn, state)
            yield self._visit(self.old.nodes[eo], self.new.nodes[en], state)
        # An enforcing step inserted (or dropped) between two others: the nodes behind it
        # are still there, one level further up.  Report the step alone and walk on.
        # The unpaired entries wait in pools indexed by subtree hash and identity, so each
        # step looks up only what is behind it, not every unpaired entry.
        pool_o = _Pool(left_o, self.ho, lambda x: _identity(self.old, x))
        for en, outer in left_n:
            node = self.new.nodes[en]
            if isinstance(node, Source) or not pool_o:
                continue
            behind = [x for i in node.inputs for x in frontier(self.new, i)]
            sub = pool_o.pair_with(behind, self.hn, lambda x: _identity(self.new, x), True)
            if sub:
                en_done.add(en)
                self.findings.append(self._inserted(o, n, node, state))
                for (eo, po), (eb, pb) in sub:
                    self._pair_passive_paths(po, outer + pb)
                    yield self._visit(self.old.nodes[eo], self.new.nodes[eb], state)
        left_n = [e for e in left_n if e[0] not in en_done]
        pool_n = _Pool(left_n, self.hn, lambda x: _identity(self.new, x))
        left_o = pool_o.left()
        eo_done: set[str] = set()
        for eo, outer in left_o:
            node = self.old.nodes[eo]
            if isinstance(node, Source) or not pool_n:
                continue
            behind = [x for i in node.inputs for x in frontier(self.old, i)]
            sub = [(b, e) for e, b in pool_n.pair_with(
                behind, self.ho, lambda x: _identity(self.old, x), False)]
            if sub:
                eo_done.add(eo)
                self.findings.append(self._removed(o, n, node, state))
                for (eb, pb), (en, pn) in sub:
                    self._pair_passive_paths(outer + pb, pn)
                    yield self._visit(self.old.nodes[eb], self.new.nodes[en], state)
        left_o = [e for e in left_o if e[0] not in eo_done]
        left_n = pool_n.left()
        for eo, _po in left_o:
            node = self.old.nodes[eo]
            if isinstance(node, Source):
                f = self.ctx.f("source-removed", f"{node.step} '{eo}' no longer feeds "
                               f"'{n.id}'", node, n, "", "inputs")
                self.findings.append(self._stateless(f, state)
                                     if _checkpoint_free(node) else f)
            else:
                self.findings.append(self._removed(o, n, node, state, "no longer feeds"))
        for en, _pn in left_n:
            node = self.new.nodes[en]
            if isinstance(node, Source) and _checkpoint_free(node):
                # a table is read afresh at every micro-batch: judged as a passive step
                self.findings.append(self._stateless(self.ctx.f(
                    "source-added", f"table {node.step} '{en}' now feeds '{n.id}'", o, node,
                    "inputs", ""), state))
            elif isinstance(node, Source):
                self.findings.append(self.ctx.f(
                    "source-added", f"{node.step} '{en}' now feeds '{n.id}'; its history "
                    "is not in the old state", o, node, "inputs", ""))
            else:
                self.findings.append(self._inserted(o, n, node, state, "now feeds"))

    def _inserted(self, o: Node, n: Node, node: Node, state: Pair | None,
                  how: str = "is inserted before") -> Finding:
        """An enforcing step of the new plan with no old counterpart, feeding ``n``.  One
        that holds no state (a stream-table join) is judged as an added passive step."""
        if self.new.info[node.id].stateful:
            tail = "its state has no history" if how == "is inserted before" else \
                "its history is not in the old state"
            return self.ctx.f("enforcing-added", f"{node.step} '{node.id}' {how} "
                              f"'{n.id}'; {tail}", o, node, "inputs", "")
        s = _state_node(state)
        return self.ctx.f("enforcing-added", f"{node.step} '{node.id}' {how} '{n.id}'; it "
                          f"holds no state{', but sits' + history_note(s) if s else ''}", o,
                          node, "inputs", "", effect="in_place", severity="warning",
                          history=s is not None, hint=RESTART)

    def _removed(self, o: Node, n: Node, node: Node, state: Pair | None,
                 how: str = "is removed from before") -> Finding:
        """An enforcing step of the old plan with no new counterpart, that fed ``o``."""
        if self.old.info[node.id].stateful:
            return self.ctx.f("enforcing-removed", f"{node.step} '{node.id}' {how} "
                              f"'{n.id}'", node, n, "", "inputs")
        s = _state_node(state)
        return self.ctx.f("enforcing-removed", f"{node.step} '{node.id}' {how} '{n.id}'; "
                          f"it held no state{', but sat' + history_note(s) if s else ''}",
                          node, n, "", "inputs", effect="in_place", severity="warning",
                          history=s is not None, hint=RESTART)

    def compare_paths(self, o: Node, n: Node, po: list[str], pn: list[str],
                      state: Pair | None) -> None:
        """Align the passive steps between a frontier pair and its consumers ``o``/``n``;
        ``state`` is the nearest stateful pair at or downstream of the consumers.

        Two passes of ``align``: first on each step's content as written, version aside
        (an unchanged step is equal to its old self without parsing anything), then, only
        inside the gaps that pass leaves, on canonical keys (``a+b`` equals ``A + b``).
        Steps paired either way are compared for their versions.  Same-step nodes left in
        a gap pair in order; the rest were added or removed.
        """
        olds = [self.old.nodes[x] for x in po]
        news = [self.new.nodes[x] for x in pn]
        memo = self.memo
        if [memo[id(a)] for a in olds] == [memo[id(b)] for b in news]:
            self._pair_passive(po, pn)
            return  # same steps, same versions, same text: nothing to compare
        self.ctx.upstream_of_state = state is not None
        self.ctx.state = _state_node(state)
        self.ctx.consumer = (o, n)
        raw = self._raw_keys_of
        for tag, i1, i2, j1, j2 in align(raw(olds), raw(news)):
            if tag == "equal":
                for a, b in zip(olds[i1:i2], news[j1:j2]):
                    self._versions(a, b)
                self._pair_passive(po[i1:i2], pn[j1:j2])
                continue
            gap_o, gap_n = olds[i1:i2], news[j1:j2]
            if not (gap_o and gap_n):
                self._pair_in_gap(gap_o, gap_n)
                continue
            for tag2, k1, k2, l1, l2 in align([_passive_key(a) for a in gap_o],
                                              [_passive_key(b) for b in gap_n]):
                if tag2 == "equal":
                    for a, b in zip(gap_o[k1:k2], gap_n[l1:l2]):
                        self._versions(a, b)
                    self._pair_passive([a.id for a in gap_o[k1:k2]],
                                       [b.id for b in gap_n[l1:l2]])
                else:
                    self._pair_in_gap(gap_o[k1:k2], gap_n[l1:l2])
        self.ctx.upstream_of_state = False
        self.ctx.state = None

    def _raw_key(self, node: Node) -> int:
        """What a step computes, as written (its version aside), numbered: equal raw keys
        imply equal ``_passive_key``s, so the first pass needs no parsing, and aligning
        small numbers hashes nothing big.  Each node object is keyed once."""
        k = self._raw.get(id(node))
        if k is None:
            names = _RAW_FIELDS.get(type(node))
            if names is None:
                names = _RAW_FIELDS[type(node)] = tuple(
                    f.name for f in fields(node)
                    if f.compare and f.name not in ("id", "inputs", "version"))
            key = (node.step, len(node.inputs), *[getattr(node, f) for f in names])
            k = self._raw[id(node)] = self._raw_keys.setdefault(key, len(self._raw_keys))
        return k

    def _raw_keys_of(self, nodes: list[Node]) -> list[int]:
        """``[self._raw_key(n) for n in nodes]``, looking up the keys already numbered
        (every node but gates, by ``merkle``) without a call each."""
        got = self._raw.get
        keys = [got(id(n)) for n in nodes]
        if None in keys:
            keys = [self._raw_key(n) for n in nodes]
        return keys

    def _pair_in_gap(self, olds: list[Node], news: list[Node]) -> None:
        """Pair same-step nodes in order; the rest were added or removed."""
        by_step: dict[str, deque[int]] = {}
        for j, b in enumerate(news):
            by_step.setdefault(b.step, deque()).append(j)
        matched: set[int] = set()
        for a in olds:
            cands = by_step.get(a.step)
            if cands:
                j = cands.popleft()
                matched.add(j)
                self.findings.extend(check_passive(a, news[j], self.ctx))
                self._versions(a, news[j])
                self._pair_passive([a.id], [news[j].id])
            else:
                self.findings.extend(check_passive(a, None, self.ctx))
        for j, b in enumerate(news):
            if j not in matched:
                self.findings.extend(check_passive(None, b, self.ctx))

    def _pair_passive(self, po: Sequence[str], pn: Sequence[str]) -> None:
        """Record passive steps paired position by position (when asked to)."""
        if self.passive is not None:
            self.passive.extend((a, b, self.new.nodes[b].step) for a, b in zip(po, pn))

    def _pair_passive_paths(self, po: list[str], pn: list[str]) -> None:
        """Record the pairs of two passive paths the walk does not compare (around an
        enforcing step inserted or removed, the paths on both of its sides joined),
        aligned as ``compare_paths`` aligns them (when asked to)."""
        if self.passive is None:
            return
        olds = [self.old.nodes[x] for x in po]
        news = [self.new.nodes[x] for x in pn]
        for tag, i1, i2, j1, j2 in align([self._raw_key(a) for a in olds],
                                         [self._raw_key(b) for b in news]):
            if tag == "equal":
                self._pair_passive(po[i1:i2], pn[j1:j2])
                continue
            by_step: dict[str, deque[str]] = {}
            for b in news[j1:j2]:
                by_step.setdefault(b.step, deque()).append(b.id)
            for a in olds[i1:i2]:
                if by_step.get(a.step):
                    self._pair_passive([a.id], [by_step[a.step].popleft()])

    def _versions(self, a: Node, b: Node) -> None:
        if a.version != b.version:
            self.findings.extend(check_version(a, b, self.ctx))


def _checkpoint_free(node: Node) -> bool:
    """Whether nothing of ``node`` is in the checkpoint, so that it may change on a restart
    (given it holds no state): not the sink (its key and topic are what consumers read),
    not a stream source (the checkpoint holds its offsets); a table source is read afresh
    at every micro-batch when it is read as a snapshot (a changelog's offsets are in the
    checkpoint)."""
    if isinstance(node, Sink):
        return False
    return not isinstance(node, Source) or table_read(node) == SNAPSHOT


def _state_node(state: Pair | None) -> Node | None:
    return None if state is None else state[1] or state[0]


def _passive_key(node: Node) -> tuple:
    return node.canonical()


Opcode = tuple[str, int, int, int, int]

#: how many times a gap between anchors is searched again for anchors of its own
_ALIGN_DEPTH = 8


def align(a: Sequence[Hashable], b: Sequence[Hashable]) -> list[Opcode]:
    """Align two key sequences into ``difflib``-style opcodes, in O(n·log n).

    ``difflib.SequenceMatcher`` looks for the longest block of equal keys, then again on
    each side of it: quadratic in the number of changes on long paths.  This anchors on
    unique keys instead (patience alignment, as in ``git diff --patience``), and keeps
    difflib's preference for long blocks:

    1. equal keys at the start and at the end are matched first;
    2. in what is left, every key that occurs exactly once on each side is an anchor, and
       the block of equal keys around it (repeated keys included) a candidate; of the
       chains of candidates in the same order on both sides, the one that matches most
       keys is taken (a heaviest increasing subsequence, n·log n with a Fenwick tree);
    3. each gap between two taken blocks is aligned again from step 1, uniqueness counted
       inside the gap (a key repeated in the whole path may be unique between two
       anchors), at most ``_ALIGN_DEPTH`` levels deep, so the total stays n·log n;
    4. what is still unmatched is a gap: ``replace`` (both sides), ``delete`` or
       ``insert``; the caller pairs same-step nodes in a gap in order.

    On the passive paths of the fixtures (a step changed, added, removed, moved or
    re-versioned) this pairs exactly as difflib did; where the two differ (equally good
    alignments of repeated steps) both are valid alignments.
    """
    out: list[Opcode] = []
    _align(a, b, 0, len(a), 0, len(b), 0, out)
    merged: list[Opcode] = []
    for op in out:
        if merged and op[0] == "equal" and merged[-1][0] == "equal":
            _, i1, _, j1, _ = merged[-1]
            merged[-1] = ("equal", i1, op[2], j1, op[4])
        else:
            merged.append(op)
    return merged


def _align(a: Sequence[Hashable], b: Sequence[Hashable], i1: int, i2: int, j1: int,
           j2: int, depth: int, out: list[Opcode]) -> None:
    p = 0  # equal keys at the start...
    while i1 + p < i2 and j1 + p < j2 and a[i1 + p] == b[j1 + p]:
        p += 1
    q = 0  # ... and at the end
    while i2 - q > i1 + p and j2 - q > j1 + p and a[i2 - q - 1] == b[j2 - q - 1]:
        q += 1
    if depth < _ALIGN_DEPTH and (i2 - i1 > p + q or j2 - j1 > p + q):
        blocks = _anchor_blocks(a, b, i1, i2, j1, j2, p, q)
    else:
        blocks = [x for x in ((i1, j1, p), (i2 - q, j2 - q, q)) if x[2]]
    i, j = i1, j1
    for bi, bj, size in blocks:
        if bi > i or bj > j:
            if depth < _ALIGN_DEPTH and bi > i and bj > j:
                _align(a, b, i, bi, j, bj, depth + 1, out)
            else:
                out.append(("replace" if bi > i and bj > j else "delete" if bi > i
                            else "insert", i, bi, j, bj))
        out.append(("equal", bi, bi + size, bj, bj + size))
        i, j = bi + size, bj + size
    if i < i2 or j < j2:
        if depth < _ALIGN_DEPTH and i < i2 and j < j2 and blocks:
            _align(a, b, i, i2, j, j2, depth + 1, out)
        else:
            out.append(("replace" if i < i2 and j < j2 else "delete" if i < i2
                        else "insert", i, i2, j, j2))


def _anchor_blocks(a: Sequence[Hashable], b: Sequence[Hashable], i1: int, i2: int,
                   j1: int, j2: int, head: int, tail: int) -> list[tuple[int, int, int]]:
    """Of the blocks of equal keys around the keys unique on both sides of ``a[i1:i2]``
    and ``b[j1:j2]``, and the equal ``head`` keys at the start and ``tail`` at the end, the chain
    in the same order on both sides that matches most keys, as ``(i, j, size)``."""
    in_a: dict[Hashable, int] = {}
    for i in range(i1, i2):
        in_a[a[i]] = -1 if a[i] in in_a else i
    in_b: dict[Hashable, int] = {}
    for j in range(j1, j2):
        key = b[j]
        if in_a.get(key, -1) >= 0:
            in_b[key] = -1 if key in in_b else j
    anchors = sorted((in_a[key], j) for key, j in in_b.items() if j >= 0)
    # Grow each anchor into its block.  A block holds no anchor of another diagonal, so it
    # lies between its neighbours' anchors: growing them all costs O(n), and the blocks'
    # starts increase with the anchors (the first and last blocks among them).
    blocks: list[tuple[int, int, int]] = [(i1, j1, head)] if head else []
    end, diagonal = (i1 + head, i1 - j1) if head else (-1, None)
    for i, j in anchors:
        if i - j == diagonal and i < end:
            continue  # inside the block of the anchor before
        s, t = i, j
        while s > i1 and t > j1 and a[s - 1] == b[t - 1]:
            s, t = s - 1, t - 1
        e, f = i + 1, j + 1
        while e < i2 and f < j2 and a[e] == b[f]:
            e, f = e + 1, f + 1
        blocks.append((s, t, e - s))
        end, diagonal = e, i - j
    if tail and blocks[-1:] != [(i2 - tail, j2 - tail, tail)]:
        blocks.append((i2 - tail, j2 - tail, tail))
    if len(blocks) < 2:
        return blocks
    # Heaviest chain: block y may follow block x when x ends before y starts on both
    # sides.  As the starts increase, the blocks whose ``a`` end is at most y's start form
    # a prefix of the list; a Fenwick tree over their ``b`` ends gives the best chain
    # ending before y's ``b`` start.  Scores are (keys matched, -index): ties go to the
    # earliest block.
    size = j2 - j1 + 1
    tree: list[tuple[int, int]] = [(0, 1)] * (size + 1)
    best: list[tuple[int, int]] = []
    back: list[int] = []
    ready = 0
    for y, (s, t, n) in enumerate(blocks):
        while ready < y and blocks[ready][0] + blocks[ready][2] <= s:
            x = blocks[ready][1] + blocks[ready][2] - j1 + 1
            while x <= size:
                if best[ready] > tree[x]:
                    tree[x] = best[ready]
                x += x & -x
            ready += 1
        before = (0, 1)
        x = t - j1 + 1
        while x > 0:
            if tree[x] > before:
                before = tree[x]
            x -= x & -x
        back.append(-before[1] if before[0] else -1)
        best.append((before[0] + n, -y))
    y = -max(best)[1]
    chain = []
    while y >= 0:
        chain.append(blocks[y])
        y = back[y]
    chain.reverse()
    return chain


def frontier(plan: Plan, start: str) -> list[tuple[str, list[str]]]:
    """Enforcing nodes reached from ``start`` through passive ones, each with the passive
    path that leads to it, in flow order (the frontier node's consumer last).

    The path is kept as links to the step nearer the consumer and built once per
    enforcing node reached: copying it at every step is quadratic on long chains.
    """
    out: list[tuple[str, list[str]]] = []
    nodes = plan.nodes
    # a link is (node id, link of the node nearer the consumer) or None
    stack: list[tuple[str, Any]] = [(start, None)]
    while stack:
        nid, link = stack.pop()
        while True:  # along a chain without the stack: its one input is popped next
            node = nodes[nid]
            if node.klass == ENFORCING:
                path = []
                while link is not None:
                    path.append(link[0])
                    link = link[1]
                out.append((nid, path))
                break
            here = link if isinstance(node, _GATES) else (nid, link)
            ins = node.inputs
            if len(ins) == 1:
                nid, link = ins[0], here
                continue
            for inp in reversed(ins):
                stack.append((inp, here))
            break
    return out


def _identity(plan: Plan, nid: str) -> tuple:
    node = plan.nodes[nid]
    if isinstance(node, Source):
        return ("source", node.topic)
    return (node.step,)


def _pair(fo, fn, old: Plan, new: Plan, ho, hn):
    """Pair frontier entries: identical subtrees first, then same identity, then same step.

    Within each key, entries pair in order; buckets (queues) keep this linear in the
    frontier size.
    """
    left_o = list(fo)
    left_n = list(fn)
    pairs = []
    keys = (
        (lambda x: ho[x], lambda x: hn[x]),
        (lambda x: _identity(old, x), lambda x: _identity(new, x)),
        (lambda x: old.nodes[x].step, lambda x: new.nodes[x].step),
    )
    for key_o, key_n in keys:
        if not left_o or not left_n:
            break
        buckets: dict[object, deque[int]] = {}
        for j, en in enumerate(left_n):
            buckets.setdefault(key_n(en[0]), deque()).append(j)
        taken: set[int] = set()
        rest_o = []
        for eo in left_o:
            cands = buckets.get(key_o(eo[0]))
            if cands:
                j = cands.popleft()
                taken.add(j)
                pairs.append((eo, left_n[j]))
            else:
                rest_o.append(eo)
        left_o = rest_o
        left_n = [en for j, en in enumerate(left_n) if j not in taken]
    return pairs, left_o, left_n


Entry = tuple[str, list[str]]


class _Pool:
    """Unpaired frontier entries of one side, in order, indexed by subtree hash and by
    identity; an entry paired once leaves both indexes."""

    def __init__(self, entries: list[Entry], hashes: dict[str, int],
                 identity: Callable[[str], tuple]) -> None:
        self.entries = entries
        self.alive = [True] * len(entries)
        self.count = len(entries)
        self.index: tuple[dict[object, deque[int]], dict[object, deque[int]]] = ({}, {})
        for k, (eid, _) in enumerate(entries):
            self.index[0].setdefault(hashes[eid], deque()).append(k)
            self.index[1].setdefault(identity(eid), deque()).append(k)

    def __bool__(self) -> bool:
        return self.count > 0

    def _take(self, which: int, key: object) -> int | None:
        queue = self.index[which].get(key)
        while queue:
            k = queue.popleft()
            if self.alive[k]:
                self.alive[k] = False
                self.count -= 1
                return k
        return None

    def pair_with(self, others: list[Entry], hashes: dict[str, int],
                  identity: Callable[[str], tuple], pool_order: bool
                  ) -> list[tuple[Entry, Entry]]:
        """Pair ``others`` with pool entries as ``_pair`` does without its last round:
        identical subtrees first, then the same identity; within a key, in order on both
        sides.  Round by round, pairs come in the pool's order or in ``others``' order."""
        first: list[tuple[int, int, Entry]] = []
        rest: list[tuple[int, Entry]] = []
        for j, e in enumerate(others):
            k = self._take(0, hashes[e[0]])
            if k is None:
                rest.append((j, e))
            else:
                first.append((k, j, e))
        second: list[tuple[int, int, Entry]] = []
        for j, e in rest:
            k = self._take(1, identity(e[0]))
            if k is not None:
                second.append((k, j, e))
        out: list[tuple[Entry, Entry]] = []
        for found in (first, second):
            if pool_order:
                found.sort(key=lambda x: x[0])
            out += [(self.entries[k], e) for k, _, e in found]
        return out

    def left(self) -> list[Entry]:
        return [e for k, e in enumerate(self.entries) if self.alive[k]]
