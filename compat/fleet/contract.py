"""The contract across a topic edge: what a producer writes and what a consumer reads.

A producer's **contract** is what its sink writes to its topic: the columns (names as
written, since JSON is read by field name, exactly and case-sensitively), their types, the
record key, the changelog mode and the record format.  A consumer's **usage** is what one
of its sources declares, and which of those columns it actually reads downstream of the
source (a column it declares and never reads may disappear without harm).

``impacts`` compares a producer's contract before and after a change (or, without a before,
as it is) with one consumer's source and returns findings *on the consumer*, codes
``upstream-*``: the consumer's source node, JSON pointers into the consumer's plan, the
producer named in the message.  What the consumer suffers decides the effect, not what
changed upstream:

- the gated source reads a missing JSON field as null and a value that does not fit the
  declared type as null (``gates.source``): nothing fails, the consumer silently computes
  on nulls from the change on.  Nothing the consumer can do live repairs that (a
  migration would replay the same records), so a column it reads that disappears or stops
  fitting is ``unsupported``; one it only declares is harmless (``none``, info);
- a stream-role source reads every record as an insert and skips tombstones: upserts are
  read as duplicates and deletions are lost, so a widened changelog mode under it is
  ``unsupported``; a table-role source keeps the latest value per key and deletes a key on
  its tombstone, so upserts and retractions are what it expects;
- a table-role source finds its key in the record key: a producer key that no longer holds
  the consumer's key columns merges or splits its rows (``unsupported``); under a stream
  source a key change only repartitions the topic (per-key order across the change).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from compat import avro as A
from compat import types as T
from compat.demand import demanded
from compat.findings import Finding, finding, register_codes
from compat.infer import INSERT, MODE_RANK, RETRACT, UPSERT, NodeInfo
from compat.model import Plan
from compat.steps import Sink, Source
from compat.steps.sink import avro_schema, written_key
from compat.steps.source import avro_schema as source_avro_schema

MODE_NAMES = {INSERT: "inserts only [I]", UPSERT: "upserts [I,UA]",
              RETRACT: "retractions [I,UB,UA,D]"}

_FIX_PRODUCER = "Keep writing it in the producer, or change the consumer in the same " \
    "change so that it no longer reads it."

register_codes({
    "upstream-avro-unreadable": (
        "unsupported", "error", "schema_evolution",
        "Keep the producer's Avro schema resolvable by the consumer's reader schema (new "
        "fields with defaults, promotions Avro allows), or change the consumer's source in "
        "the same change."),
    "upstream-column-removed": (
        "unsupported", "error", "schema_evolution",
        "Keep the column in the producer's output, or stop reading it in the consumer in "
        "the same change (the consumer would read nulls from the change on)."),
    "upstream-column-added": (
        "none", "info", "schema_evolution",
        "Nothing to do: the consumer reads JSON by name and ignores the new column until "
        "its source declares it."),
    "upstream-type-changed": (
        "unsupported", "error", "schema_evolution",
        "Keep a type the consumer's declared type can hold, or widen the consumer's source "
        "column to it in the same change (values that do not fit are read as nulls)."),
    "upstream-key-changed": (
        "unsupported", "error", "topology",
        "Keep the producer's key columns, or write the new key to a new topic and move the "
        "consumer over."),
    "upstream-mode-widened": (
        "unsupported", "error", "schema_evolution",
        "Keep the producer's changelog mode, or read the topic as a table (role table, "
        "keyed like the producer) in the consumer, which handles upserts and tombstones."),
    "upstream-mode-narrowed": (
        "none", "info", "schema_evolution",
        "Nothing to do: the producer now writes a subset of the change kinds the consumer "
        "handles."),
    "upstream-mode-mismatch": (
        "none", "warning", "schema_evolution",
        "Make sure the consumer means to read every update as a new record (and to skip "
        "deletions); otherwise read the topic as a table (role table)."),
    "upstream-format-changed": (
        "unsupported", "error", "schema_evolution",
        "Keep the producer's record format, or change the consumer's source format in the "
        "same change."),
    "upstream-topic-changed": (
        "unsupported", "error", "topology",
        "Point the consumer's source at the new topic in the same change (a live "
        "migration of the consumer), or keep the producer's topic."),
    "upstream-removed": (
        "unsupported", "error", "topology",
        "Keep the producer, or remove or repoint the queries that read its topic in the "
        "same change."),
    "upstream-column-missing": (
        "unsupported", "error", "schema_evolution",
        "Write the column in the producer, or stop reading it in the consumer: it reads "
        "null for every record."),
    "upstream-schema-mismatch": (
        "unsupported", "error", "schema_evolution",
        "Declare the type (or format) the producer writes, or a wider one, in the "
        "consumer's source: values that do not fit are read as nulls."),
})


# -- the two sides of an edge ----------------------------------------------------------------


@dataclass(frozen=True)
class Contract:
    """What a producer writes to its topic (from its sink): columns as written, with their
    types, the record key as written (a version 2 sink keys a windowed output by its window
    too), the changelog mode (``INSERT``, ``UPSERT``, ``RETRACT``) and the record format."""

    query: str
    topic: str
    columns: tuple[tuple[str, str], ...]
    key_columns: tuple[str, ...]
    mode: str
    format: str
    #: the Avro writer schema (``compat.avro``) of an Avro output, else None
    avro: Any = field(default=None, compare=False)

    def column(self, name: str) -> str | None:
        """The type the producer writes ``name`` with (exact name), or None."""
        return dict(self.columns).get(name)


def produced(plan: Plan) -> Contract:
    """The contract of ``plan``'s output topic, from its (analysed) sink."""
    sink = plan.sink
    assert isinstance(sink, Sink)
    info: NodeInfo = plan.info[sink.id]
    names = info.names or tuple(c[0] for c in info.columns)
    return Contract(plan.query, sink.topic,
                    tuple((n, t) for n, (_, t) in zip(names, info.columns)),
                    tuple(written_key(sink, info)), info.mode, sink.format,
                    avro_schema(sink, info) if sink.format == "avro" else None)


@dataclass(frozen=True)
class Usage:
    """What a consumer's source declares (columns as written, with their types) and which
    declared columns the consumer reads anywhere downstream of the source; ``readers``
    says, per used column, which steps read it (for messages)."""

    query: str
    node: str
    topic: str
    declared: tuple[tuple[str, str], ...]
    key_columns: tuple[str, ...]
    format: str
    role: str
    used: frozenset[str]
    #: a stream-role source reads every record as an insert (and skips tombstones): an
    #: upsert or retraction changelog would be misread
    inserts_only: bool
    readers: tuple[tuple[str, tuple[str, ...]], ...] = field(default=(), compare=False)
    #: the Avro reader schema (``compat.avro``) of an Avro source, else None
    avro: Any = field(default=None, compare=False)

    def read_by(self, name: str) -> tuple[str, ...]:
        return dict(self.readers).get(name, ())


def usage(plan: Plan, node: str) -> Usage:
    """What source ``node`` of ``plan`` declares, and what the plan reads of it."""
    src = plan.nodes[node]
    assert isinstance(src, Source)
    info = plan.info[node]
    names = info.names or tuple(c[0] for c in info.columns)
    demand = demanded(plan)[node]
    readers: dict[str, set[str]] = {}
    for name in names:
        who = demand.get(name.lower())
        if who:
            readers.setdefault(name, set()).update(who)
    # The event-time column feeds the watermark; a table's key decides which value is
    # the latest one.
    if src.event_time is not None:
        for name in names:
            if name.lower() == src.event_time.column.lower():
                readers.setdefault(name, set()).add(node)
    if src.role == "table":
        keys = {k.lower() for k in src.key_columns}
        for name in names:
            if name.lower() in keys:
                readers.setdefault(name, set()).add(node)
    return Usage(plan.query, node, src.topic,
                 tuple((n, t) for n, (_, t) in zip(names, info.columns)),
                 tuple(src.key_columns), src.format, src.role, frozenset(readers),
                 src.role == "stream",
                 tuple(sorted((n, tuple(sorted(w))) for n, w in readers.items())),
                 source_avro_schema(src) if src.format == "avro" else None)


# -- impacts across one edge -----------------------------------------------------------------


def readable(written: str, declared: str) -> bool:
    """A reader declaring ``declared`` reads values written as ``written``: the same type or
    a narrower one (int into bigint), or anything into a string (as its JSON text)."""
    return declared == "string" or T.can_widen(written, declared)


def impacts(producer_old: Contract | None, producer_new: Contract | None, consumer: Plan,
            node: str) -> list[Finding]:
    """Findings on ``consumer``'s source ``node`` for the producer's change from
    ``producer_old`` to ``producer_new`` (None: the producer does not exist on that side).
    Without ``producer_old`` the consumer is checked against ``producer_new`` as it is
    (steady state: columns it reads that nobody writes, types that do not fit)."""
    use = usage(consumer, node)
    edge = _Edge(consumer, use, producer_old, producer_new)
    return edge.findings()


class _Edge:
    """One producer/consumer pair: builds the findings, all on the consumer's source."""

    def __init__(self, plan: Plan, use: Usage, old: Contract | None,
                 new: Contract | None) -> None:
        self.plan, self.use, self.new = plan, use, new
        # A producer that wrote another topic before was not this topic's producer.
        self.old = old if old is not None and old.topic == use.topic else None
        self.out: list[Finding] = []
        self.producer = (new or old).query if (new or old) else "?"

    def ptr(self, field: str | None = None) -> str:
        return self.plan.pointer(self.use.node, field)

    def add(self, code: str, message: str, field: str | None = None, **kw: object) -> None:
        p = self.ptr(field)
        self.out.append(finding(code, message, old=self.use.node, new=self.use.node,
                                old_pointer=p, new_pointer=p, **kw))  # type: ignore[arg-type]

    def src(self) -> str:
        return f"source '{self.use.node}' of query '{self.use.query}'"

    def readers(self, name: str) -> str:
        who = self.use.read_by(name)
        return f" (read by {', '.join(repr(w) for w in who)})" if who else ""

    def findings(self) -> list[Finding]:
        use, new, old = self.use, self.new, self.old
        if new is None or new.topic != use.topic:
            if old is None:
                return []  # nobody in the fleet writes the topic, then or now: an input
            if new is None:
                self.add("upstream-removed", f"query '{old.query}', which writes topic "
                         f"'{use.topic}', is removed; {self.src()} still reads it and gets "
                         "no more records", "topic")
            else:
                self.add("upstream-topic-changed", f"query '{new.query}' now writes topic "
                         f"'{new.topic}' instead of '{use.topic}'; {self.src()} still reads "
                         f"'{use.topic}', which nobody writes any more", "topic")
            return self.out
        self.format()
        self.mode()
        self.key()
        if new.avro is not None and use.avro is not None:
            # Avro records carry their writer schema's id: resolution decides, not names
            self.avro()
        else:
            self.columns()
        return self.out

    def avro(self) -> None:
        use, new = self.use, self.new
        assert new is not None
        for inc in A.incompatibilities(use.avro, new.avro):
            self.add("upstream-avro-unreadable", f"query '{new.query}' writes topic "
                     f"'{use.topic}' with an Avro schema that {self.src()} cannot resolve "
                     f"with its reader schema: {inc.message} (Avro rule {inc.rule})",
                     "avro/schema" if self.plan.nodes[use.node].avro is not None and
                     self.plan.nodes[use.node].avro.schema else "schema")

    # -- record format, changelog mode and key ------------------------------------------------

    def format(self) -> None:
        use, new, old = self.use, self.new, self.old
        assert new is not None
        if old is not None and old.format != new.format:
            ok = new.format == use.format
            self.add("upstream-format-changed", f"query '{new.query}' writes topic "
                     f"'{use.topic}' as {new.format} instead of {old.format}; {self.src()} "
                     f"reads it as {use.format}", "format",
                     **({"effect": "none", "severity": "info", "hint": "Nothing to do: the "
                         "consumer reads the new format."} if ok else {}))
        elif new.format != use.format:
            self.add("upstream-schema-mismatch", f"query '{new.query}' writes topic "
                     f"'{use.topic}' as {new.format}, but {self.src()} reads it as "
                     f"{use.format}", "format")

    def mode(self) -> None:
        use, new, old = self.use, self.new, self.old
        assert new is not None
        a, b = (old.mode if old is not None else None), new.mode
        how = "as a stream of inserts (role stream)" if use.inserts_only else \
            "as a table (latest value per key)"
        if a is not None and a != b and MODE_RANK[b] < MODE_RANK[a]:
            self.add("upstream-mode-narrowed", f"query '{new.query}' writes topic "
                     f"'{use.topic}' as {MODE_NAMES[b]} instead of {MODE_NAMES[a]}; "
                     f"{self.src()} reads it {how}", "role")
        elif a is not None and a != b:
            eff = {} if use.inserts_only and b != INSERT else \
                {"effect": "none", "severity": "info",
                 "hint": "Nothing to do: a table source keeps the latest value per key and "
                 "deletes a key on its tombstone."}
            why = "; every update would be read as a new record and deletions lost" \
                if use.inserts_only else ""
            self.add("upstream-mode-widened", f"query '{new.query}' writes topic "
                     f"'{use.topic}' as {MODE_NAMES[b]} instead of {MODE_NAMES[a]}; "
                     f"{self.src()} reads it {how}{why}", "role", **eff)
        elif b != INSERT and use.inserts_only:
            self.add("upstream-mode-mismatch", f"query '{new.query}' writes topic "
                     f"'{use.topic}' as {MODE_NAMES[b]}, and {self.src()} reads it {how}: "
                     "every update is read as a new record and deletions are skipped",
                     "role")

    def key(self) -> None:
        use, new, old = self.use, self.new, self.old
        assert new is not None
        table = use.role == "table"
        mine = [k.lower() for k in use.key_columns]
        theirs = [k.lower() for k in new.key_columns]
        # A table source takes its key columns from the record key (a JSON object).
        fits = set(mine) <= set(theirs) and (not theirs or set(theirs) <= set(mine))
        if old is not None and [k.lower() for k in old.key_columns] != theirs:
            msg = f"query '{new.query}' keys topic '{use.topic}' by {list(new.key_columns)} " \
                f"instead of {list(old.key_columns)}"
            if table and not fits:
                self.add("upstream-key-changed", f"{msg}; {self.src()} reads it as a table "
                         f"keyed by {list(use.key_columns)}: rows of one key would be "
                         "merged or split", "key_columns")
            elif table:
                self.add("upstream-key-changed", f"{msg}; {self.src()} reads it as a table "
                         f"keyed by {list(use.key_columns)}, which the record key still "
                         "holds: records written before the change stay under their old "
                         "key bytes until compaction", "key_columns", effect="none",
                         severity="warning", hint="Nothing to do for reading; expect the "
                         "topic to hold both key forms until it is compacted.")
            else:
                self.add("upstream-key-changed", f"{msg}: the topic is partitioned anew, so "
                         f"{self.src()} (a stream) may see records of one key out of order "
                         "across the change", None, effect="none", severity="warning",
                         hint="Nothing to do unless the consumer relies on per-key order in "
                         "Kafka (Spark's own state does not).")
        elif old is None and table and not fits:
            self.add("upstream-schema-mismatch", f"query '{new.query}' keys topic "
                     f"'{use.topic}' by {list(new.key_columns)}, but {self.src()} reads it "
                     f"as a table keyed by {list(use.key_columns)}", "key_columns")

    # -- columns and types --------------------------------------------------------------------

    def columns(self) -> None:
        use, new, old = self.use, self.new, self.old
        assert new is not None
        declared = {n for n, _ in use.declared}
        for i, (name, dtype) in enumerate(use.declared):
            self.column(i, name, dtype)
        if old is None:
            return
        before = {n for n, _ in old.columns}
        for name, t in new.columns:
            if name in before or name in declared:
                continue
            self.add("upstream-column-added", f"query '{new.query}' writes a new column "
                     f"'{name}' ({t}) to topic '{use.topic}'; {self.src()} does not "
                     "declare it", "schema")

    def column(self, i: int, name: str, dtype: str) -> None:
        use, new, old = self.use, self.new, self.old
        assert new is not None
        used = name in use.used
        n = new.column(name)
        o = old.column(name) if old is not None else None
        col_ptr, type_ptr = f"schema/{i}", f"schema/{i}/type"
        harmless = {"effect": "none", "severity": "info",
                    "hint": f"Nothing to do: query '{use.query}' declares '{name}' but never "
                    "reads it (drop it from the source schema to say so)."}
        if n is None:
            case = next((c for c, _ in new.columns if c.lower() == name.lower()), None)
            why = f" (it writes '{case}': JSON field names are case-sensitive)" if case \
                else ""
            if not case and o is not None and old is not None:
                # Renamed, most likely: a new column of the same type where it was.
                at = [c for c, _ in old.columns].index(name)
                if at < len(new.columns) and new.columns[at][1] == o and \
                        old.column(new.columns[at][0]) is None:
                    why = f" (renamed to '{new.columns[at][0]}'?)"
            if o is not None:
                self.add("upstream-column-removed", f"query '{new.query}' no longer writes "
                         f"column '{name}' ({o}) to topic '{use.topic}'{why}; {self.src()} "
                         + (f"reads it{self.readers(name)} and would get nulls" if used
                            else "declares it but never reads it"), col_ptr,
                         **({} if used else harmless))
            elif used:
                self.add("upstream-column-missing", f"query '{new.query}' does not write "
                         f"column '{name}' to topic '{use.topic}'{why}, which {self.src()} "
                         f"reads{self.readers(name)}: it is null in every record", col_ptr)
            return
        fits = readable(n, dtype)
        if o is None and old is not None:
            # The producer starts writing a column the consumer already declares.
            if fits:
                self.add("upstream-column-added", f"query '{new.query}' now writes column "
                         f"'{name}' ({n}) to topic '{use.topic}', which {self.src()} "
                         f"declares as {dtype}", col_ptr,
                         hint="Nothing to do: the consumer reads it from the change on "
                         "(records written before have it null).")
                return
        elif o is not None and o != n:
            if fits:
                self.add("upstream-type-changed", f"query '{new.query}' writes column "
                         f"'{name}' of topic '{use.topic}' as {n} instead of {o}; "
                         f"{self.src()} declares {dtype}, which holds it", type_ptr,
                         effect="none", severity="info",
                         hint="Nothing to do: the consumer's declared type holds the new "
                         "values.")
            elif used:
                self.add("upstream-type-changed", f"query '{new.query}' writes column "
                         f"'{name}' of topic '{use.topic}' as {n} instead of {o}; "
                         f"{self.src()} declares {dtype} and reads it{self.readers(name)}: "
                         "values that do not fit are read as nulls", type_ptr)
            else:
                self.add("upstream-type-changed", f"query '{new.query}' writes column "
                         f"'{name}' of topic '{use.topic}' as {n} instead of {o}; "
                         f"{self.src()} declares {dtype} but never reads it", type_ptr,
                         **harmless)
            return
        if not fits and used:
            self.add("upstream-schema-mismatch", f"query '{new.query}' writes column "
                     f"'{name}' of topic '{use.topic}' as {n}, but {self.src()} declares "
                     f"{dtype} and reads it{self.readers(name)}: values that do not fit are "
                     "read as nulls", type_ptr)


__all__ = ["MODE_NAMES", "Contract", "Usage", "impacts", "produced", "readable", "usage"]
