"""``theseus prove OLD NEW``: Spark is the oracle of a verdict.

The checker encodes Spark's restart rules by hand; this runs the upgrade for real on small
generated input and says whether Spark agrees.

1. Load both plans and check them: the verdict, and whether a finding says history stays
   computed the old way (``Finding.history``).
2. Generate input from the plans' source schemas (:func:`generate`): seeded, event times
   rising with no late records, keys from small pools (the string pool holds the plans'
   string literals) so that groups, joins, duplicates and filters really happen; part 2
   brings fresh key values too.
3. Give every source topic and every output a topic of its own (a run never reads another
   run's records).
4. Start OLD on its checkpoint and NEW on the reference's, once each.  For each of the
   three chunks of part 1: produce it in one Kafka transaction (both read committed
   records only, so a micro-batch never holds part of a chunk), then wait until both
   queries have processed everything (``processAllAvailable``): three micro-batches (and
   the no-data batches a moved watermark asks for) in one query start, with the same
   boundaries in both, so the watermark moves the same way.  Stop OLD.
5. Copy OLD's checkpoint; ask the checker what a restart of NEW on it does
   (``migrate.ckcheck``).
6. Produce part 2; restart NEW on the copy, let the reference, still running, process
   part 2 beside it, and stop both.
7. Judge (:func:`judge`): ``fails`` (Spark's error class), ``starts_correct`` or
   ``starts_wrong`` by the verdict's promise, and whether that agrees with the verdict and
   with the predicted restart (:func:`agreement`).

Only :class:`SparkRuntime` touches Spark and Kafka, imported lazily; everything else is
plain Python, tested with a fake runtime.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import tempfile
import threading
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from compat.check import Report, check_plans, load_plan
from compat.errors import Refused, RuntimeFailure, TheseusError
from compat.model import Plan
from compat.serde import dumps

if TYPE_CHECKING:
    from migrate.jobsession import Load

#: the exit code of a proof that Spark disagrees with (``compat.exits``)
DISAGREES_EXIT = 7
#: the exit code of a vacuous proof: Spark started, but no row was compared, so nothing
#: shows whether the verdict's promise holds (``compat.exits``)
VACUOUS_EXIT = 8

#: the records of part 1 go to OLD in this many micro-batches
CHUNKS = 3
#: the trigger of prove's running queries: short, since each chunk waits for the next
#: trigger (and the no-data batch after it for the one after); not 0, which polls the
#: broker every 10 ms while a query waits for its next chunk
TRIGGER = "200 milliseconds"
#: Held by whatever sets the shared Spark session's conf and starts or plans on it: proofs
#: may run side by side on one session (bench/truth.py --jobs), a streaming query copies the
#: session's conf when it starts, and a start or a prediction sets confs of its own (the
#: shuffle partitions, the state store provider, the state reader's).
SESSION = threading.RLock()
#: the first event time of the generated input, and the time between two records
T0 = 1_704_067_200  # 2024-01-01T00:00:00Z
TICK = 7
#: fresh key values of part 2 carry this mark (strings) or start here (numbers): a key that
#: holds one was never seen before the restart
FRESH = "fresh"
FRESH_INT = 1_000_000

GREEN = ("identical", "in_place")


# -- 2. the input ---------------------------------------------------------------------------

@dataclass(frozen=True)
class TopicSpec:
    """A source topic as both plans read it: its columns (the union of both plans'
    schemas), the partitions each declares, its key and event-time columns."""

    name: str
    columns: tuple[tuple[str, str], ...]
    partitions: int
    new_partitions: int
    key_columns: tuple[str, ...] = ()
    table: bool = False
    #: format avro: the writer schema its records are produced with (JSON text), else None
    avro: str | None = None


def distinct_columns(plans: Iterable[Plan]) -> frozenset[str]:
    """Source columns whose values must not repeat for the output to mean anything: what
    a top-N orders by (a tie makes the rows it keeps an arbitrary choice, which two runs
    may make differently), and, in a plan with no aggregate and no join, the sink's key
    columns read straight from the source (rows are told apart by them; an aggregate's
    or a join's keys must repeat instead)."""
    out: set[str] = set()
    for plan in plans:
        steps = {n.step for n in plan.nodes.values()}
        for node in plan.nodes.values():
            if node.step == "top_n":
                out |= {o.expr for o in node.order_by}
        if not steps & {"aggregate", "join"}:
            out |= set(plan.sink.key_columns)
    return frozenset(out)


@dataclass
class Input:
    topics: dict[str, TopicSpec]
    #: part 1 in CHUNKS chunks, then part 2; each record (topic, key JSON or None, value)
    chunks: list[list[tuple[str, str | None, dict[str, Any]]]]
    part2: list[tuple[str, str | None, dict[str, Any]]]


def source_topics(old: Plan, new: Plan) -> dict[str, TopicSpec]:
    """Every topic either plan reads, with the columns of both (a column only the new plan
    declares is produced from the start: the old plan ignores what it does not declare)."""
    from compat.steps import Source

    found: dict[str, dict[str, Any]] = {}
    for side, plan in (("old", old), ("new", new)):
        for node in plan.nodes.values():
            if not isinstance(node, Source):
                continue
            t = found.setdefault(node.topic, {"columns": {}, "old": None, "new": None,
                                               "keys": node.key_columns,
                                               "table": node.role == "table",
                                               "avro": None})
            for col in node.schema:
                t["columns"].setdefault(col.name, col.type)
            t[side] = max(t[side] or 0, node.partitions)
            if node.format == "avro" and (t["avro"] is None
                                          or len(node.schema) >= t["avro"][0]):
                t["avro"] = (len(node.schema), node)
    return {name: TopicSpec(name, tuple(t["columns"].items()),
                            t["old"] or t["new"], t["new"] or t["old"], tuple(t["keys"]),
                            t["table"], _writer_schema(t["avro"][1]) if t["avro"] else None)
            for name, t in found.items()}


def _writer_schema(node: Any) -> str:
    """The writer schema of an Avro source topic's generated records: the reader schema of
    the plan's source that declares the most columns (the new plan's on a tie), registered
    as it is, so that each plan resolves the records by Avro's rules as it would a
    producer's (a column only the other plan declares is read as its default)."""
    from compat import avro as A
    from compat.steps.source import avro_schema

    return A.canonical(avro_schema(node))


_STRING = re.compile(r"'((?:[^'\\]|\\.|'')*)'")
_NUMBER = re.compile(r"(?<![\w.])(-?\d+(?:\.\d+)?)(?![\w.])")
#: node fields that hold names, not expressions
_NOT_EXPRESSIONS = frozenset({"id", "step", "topic", "format", "role", "mode", "delivery",
                              "name", "type", "inputs", "key_columns", "column",
                              "watermark", "size", "slide", "gap", "within"})


def literals(plans: Iterable[Plan]) -> tuple[list[str], list[float]]:
    """The string and number literals of the plans' expressions, so that the generated
    input makes every predicate keep some rows and drop others."""
    strings: set[str] = set()
    numbers: set[float] = set()

    def walk(v: Any, key: str | None) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                walk(x, k)
        elif isinstance(v, list):
            for x in v:
                walk(x, key)
        elif isinstance(v, str) and key not in _NOT_EXPRESSIONS:
            for m in _STRING.finditer(v):
                strings.add(m.group(1).replace("''", "'"))
            for m in _NUMBER.finditer(_STRING.sub("''", v)):
                numbers.add(float(m.group(1)))

    for plan in plans:
        for node in json.loads(dumps(plan))["nodes"]:
            walk(node, None)
    return sorted(strings), sorted(numbers)


_EQUALS = re.compile(r"`?([A-Za-z_]\w*)`?\s*(?:=|==)\s*'((?:[^'\\]|\\.|'')*)'")


def compared_literals(plans: Iterable[Plan]) -> dict[str, list[str]]:
    """The string literals the plans' predicates compare a column with (``region =
    'eu'``), per column name."""
    out: dict[str, set[str]] = {}
    for plan in plans:
        for node in json.loads(dumps(plan))["nodes"]:
            for k, v in node.items():
                if isinstance(v, str) and k not in _NOT_EXPRESSIONS:
                    for m in _EQUALS.finditer(v):
                        out.setdefault(m.group(1), set()).add(m.group(2).replace("''", "'"))
    return {c: sorted(v) for c, v in out.items()}


def pools(strings: Sequence[str], numbers: Sequence[float]) -> dict[str, list[Any]]:
    """One small pool per kind of type: values repeat, so groups, joins and duplicates
    occur; the literals and their neighbours are in, so filters cut both ways."""
    ints = {-1, 0, 1, 2, 3, 5}
    fracs = {-1.5, 0.0, 0.5, 1.0, 2.5, 10.0}
    near_ints: set[int] = set()
    near_fracs: set[float] = set()
    for n in numbers:
        if abs(n) < FRESH_INT // 10:
            near_ints |= {int(n) - 1, int(n), int(n) + 1}
            near_fracs |= {n - 0.5, n, n + 0.5}
    return {"string": [f"k{i}" for i in range(5)] + list(strings), "literal": list(strings),
            "int": sorted(ints | near_ints), "frac": sorted(fracs | near_fracs),
            "near_int": sorted(near_ints), "near_frac": sorted(near_fracs),
            "bool": [True, False]}


_INTS = ("int", "bigint", "smallint", "tinyint", "integer", "long", "short", "byte")
_FRACS = ("double", "float", "real")


def _iso(t: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def value(typ: str, rng: random.Random, pool: dict[str, list[Any]], now: int,
          fresh: int | None) -> Any:
    """A value of Spark type ``typ``: ``now`` for times (one clock for every source, so
    that join time bounds match), a fresh key value when ``fresh`` is given."""
    t = typ.lower()
    if t == "string":
        if fresh is not None:
            return f"{FRESH}{fresh}"
        if pool["literal"] and rng.random() < 0.3:
            # a predicate's literal often enough that `tier = 'gold'` keeps rows of a
            # small input (measured: join_stream_table_type_changed compared none)
            return rng.choice(pool["literal"])
        return rng.choice(pool["string"])
    if t in _INTS:
        if fresh is not None:
            return FRESH_INT + fresh
        return rng.choice(_numbers(pool, "int", rng))
    if t in _FRACS or t.startswith("decimal"):
        if fresh is not None:
            return float(FRESH_INT + fresh)
        return rng.choice(_numbers(pool, "frac", rng))
    if t == "boolean":
        return rng.choice(pool["bool"])
    if t in ("timestamp", "timestamp_ntz"):
        return _iso(now)
    if t == "date":
        return _iso(now)[:10]
    if t.startswith("array<") and t.endswith(">"):
        if fresh is not None:  # a fresh array holds fresh elements only (exploded: keys)
            return [value(t[6:-1], rng, pool, now, fresh + j) for j in range(2)]
        return [value(t[6:-1], rng, pool, now, None) for _ in range(rng.randint(0, 2))]
    if t.startswith("map<") and t.endswith(">"):
        inner = t[4:-1].split(",", 1)[-1]
        return {rng.choice(pool["string"]): value(inner, rng, pool, now, None)
                for _ in range(rng.randint(0, 2))}
    if t.startswith("struct<") and t.endswith(">"):
        out = {}
        for part in _split_fields(t[7:-1]):
            name, _, ft = part.partition(":")
            out[name.strip("`")] = value(ft, rng, pool, now, None)
        return out
    return None  # binary, intervals...: null is a value Spark reads for any type


def _numbers(pool: dict[str, list[Any]], kind: str, rng: random.Random) -> list[Any]:
    """Half the time a neighbour of a plan's literal (n - 1, n, n + 1): `amount > 100` then
    keeps rows of a small input, where the general pool has one value in nine above 100
    (measured: transparent_filter_reformatted compared no row after the restart)."""
    near = pool.get(f"near_{kind}")
    return near if near and rng.random() < 0.5 else pool[kind]


def _split_fields(body: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in body:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + ([cur] if cur else [])


def _element(typ: str) -> str:
    """The type of an array's elements (of arrays of arrays...), else the type."""
    t = typ.lower()
    while t.startswith("array<") and t.endswith(">"):
        t = t[6:-1]
    return t


def _distinct(typ: str, v: Any, serial: int) -> Any:
    """``v`` made unique by the record's serial number, keeping its sign and size where
    the type allows (a filter on the column still cuts both ways)."""
    t = typ.lower()
    if t in _INTS:
        return serial * 10 + (v % 10 if isinstance(v, int) else 0)
    if t in _FRACS or t.startswith("decimal"):
        return round((v if isinstance(v, (int, float)) else 0) + serial * 1e-4, 4)
    if t == "string":
        return f"{v}-{serial}"
    return v


def generate(topics: dict[str, TopicSpec], strings: Sequence[str],
             numbers: Sequence[float], *, seed: int = 0, records: int = 120,
             distinct: frozenset[str] = frozenset(),
             compared: Mapping[str, Sequence[str]] | None = None) -> Input:
    """``records`` records per topic, reproducible from ``seed``.  Two thirds go to part 1
    (in CHUNKS chunks), the rest to part 2.  Records of all topics are interleaved on one
    rising clock (TICK seconds apart): no record is late for any watermark.  About one
    record in ten repeats the one before it (a deduplication drops it).  In part 2 about
    one record in three is fresh: its string columns and arrays of strings (its integer
    ones, when it has none) draw from a small pool of values never seen before, so that
    fresh keys group and join among themselves; a string column of a fresh record holds a
    plan's string literal half the time when a predicate compares that column with it
    (``compared``: :func:`compared_literals`), so that a filter on it keeps fresh rows
    too.  A column of ``distinct`` never repeats a value
    (:func:`distinct_columns`), duplicates aside."""
    if records < 2 * CHUNKS:
        raise TheseusError("too few records to prove anything",
                           expected=f"--records of at least {2 * CHUNKS}",
                           found=str(records))
    rng = random.Random(seed)
    pool = pools(strings, numbers)
    compared = dict(compared or {})
    n1 = records * 2 // 3
    rows: list[list[tuple[str, str | None, dict[str, Any]]]] = [[] for _ in range(records)]
    now = T0
    last: dict[str, dict[str, Any]] = {}
    for i in range(records):
        for name in sorted(topics):
            spec = topics[name]
            now += TICK
            if name in last and rng.random() < 0.1:
                rec = dict(last[name])  # a duplicate, at the same time: not late
            else:
                rec = {c: value(t, rng, pool, now, None) for c, t in spec.columns}
                if i >= n1 and rng.random() < 0.35:
                    kinds = {_element(t) for _, t in spec.columns}
                    marked = ("string",) if "string" in kinds else _INTS
                    for c, t in spec.columns:
                        if _element(t) not in marked:
                            continue
                        if c in compared and rng.random() < 0.5:
                            # a fresh row that `region = 'eu'` keeps: its other columns
                            # still make fresh keys (measured: filter_added_before_aggregate
                            # compared none when every string column was fresh)
                            rec[c] = rng.choice(compared[c])
                            continue
                        rec[c] = value(t, rng, pool, now, rng.randrange(4))
                serial = i * len(topics) + sorted(topics).index(name)
                for c, t in spec.columns:
                    if c in distinct:
                        rec[c] = _distinct(t, rec[c], serial)
            last[name] = rec
            key = json.dumps({k: rec.get(k) for k in spec.key_columns},
                             separators=(",", ":")) if spec.key_columns else None
            rows[i].append((name, key, rec))
    flat1 = [r for i in range(n1) for r in rows[i]]
    size = -(-len(flat1) // CHUNKS)
    chunks = [flat1[j * size:(j + 1) * size] for j in range(CHUNKS)]
    return Input(topics, chunks, [r for i in range(n1, records) for r in rows[i]])


# -- 7. judging -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Out:
    """One record of an output topic."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


def _round(v: Any) -> Any:
    # float sums depend on the order Spark adds them in: compare them to 9 digits
    if isinstance(v, float):
        return float(f"{v:.9g}")
    if isinstance(v, dict):
        return {k: _round(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_round(x) for x in v]
    return v


def canonical(raw: bytes | None) -> Any:
    if raw is None:
        return None
    try:
        return _round(json.loads(raw))
    except ValueError:
        return raw.decode("utf-8", "replace")


def _text(doc: Any) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def latest_per_key(*parts: Iterable[Out]) -> dict[str, Any]:
    """A keyed output as its readers see it: the last value per key (None: a tombstone),
    over ``parts`` written one after the other (each in its own offset order)."""
    out: dict[str, Any] = {}
    for part in parts:
        for r in sorted(part, key=lambda r: (r.partition, r.offset)):
            out[_text(canonical(r.key))] = canonical(r.value)
    return out


def multiset(records: Iterable[Out]) -> Counter[str]:
    """An append output as its readers see it: the records, in no order."""
    return Counter(_text(canonical(r.value)) for r in records if r.value is not None)


def is_fresh(doc: Any) -> bool:
    """A key that holds a fresh value of part 2: every input row behind it came after the
    restart (a function of the key column, upper() say, keeps the mark)."""
    if isinstance(doc, dict):
        return any(is_fresh(v) for v in doc.values())
    if isinstance(doc, list):
        return any(is_fresh(v) for v in doc)
    if isinstance(doc, str):
        return FRESH in doc.lower()
    if isinstance(doc, (int, float)) and not isinstance(doc, bool):
        return doc >= FRESH_INT
    return False


@dataclass
class Judgement:
    outcome: str  # fails | starts_correct | starts_wrong
    error_class: str | None = None
    error: str | None = None
    #: what was compared, and why that is the verdict's promise
    judged: dict[str, Any] = field(default_factory=dict)
    expected: Any = None
    got: Any = None


def keyed(plan: Plan) -> bool:
    sink = plan.sink
    return sink.mode in ("update", "complete") and bool(sink.key_columns)


def stateful(plan: Plan) -> bool:
    return any(i.stateful for i in plan.info.values())


def judge(report: Report, error: str | None, restarted: Sequence[Out],
          reference: Sequence[Out], old_output: Sequence[Out] = (),
          reference_before: Sequence[Out] = ()) -> Judgement:
    """What Spark's restart did, against the verdict's promise.

    ``restarted``: what NEW wrote after its restart on OLD's checkpoint; ``reference``:
    what NEW, run from an empty checkpoint over all the input with the same micro-batch
    boundaries, wrote over part 2.  The old output before the restart is history either
    way, so only what the restart writes is judged:

    * no finding keeps history (or a stateless plan, whose output over part 2 depends on
      part 2 alone): the restart writes what the reference writes.  A keyed output is
      compared as its readers see it: the latest value per key (a tombstone: no value)
      over the old output and then the restart's (``old_output``), against the
      reference's over all of its output (``reference_before`` then ``reference``), for
      every key either side wrote after the restart (a retraction of a row the old plan
      wrote is then right when the reference never wrote it);
    * a finding says history stays computed the old way (``Finding.history``), on a
      stateful plan: only output keys that hold a fresh value of part 2 are compared (their
      every input row came after the restart, so old history cannot reach them); a key
      first seen after the restart is not enough, since the old plan may have dropped rows
      of it that the new one keeps."""
    if error is not None:
        return Judgement("fails", error_class(error), first_lines(error))
    new = report.new
    history = any(f.history for f in report.findings) and stateful(new)
    rule = "fresh_keys" if history else "part2"
    if keyed(new):
        touched = set(latest_per_key(reference)) | set(latest_per_key(restarted))
        seen_want = latest_per_key(reference_before, reference)
        seen_got = latest_per_key(old_output, restarted)
        want = {k: seen_want.get(k) for k in touched}
        got = {k: seen_got.get(k) for k in touched}
        if history:
            want = {k: v for k, v in want.items() if is_fresh(json.loads(k))}
            got = {k: v for k, v in got.items() if is_fresh(json.loads(k))}
        semantics = "latest value per key"
    else:
        want_c, got_c = multiset(reference), multiset(restarted)
        if history:
            keys = tuple(new.sink.key_columns)

            def fresh_row(text: str) -> bool:
                doc = json.loads(text)
                part = {k: doc.get(k) for k in keys} if keys and isinstance(doc, dict) \
                    else doc
                return is_fresh(part)
            want_c = Counter({k: n for k, n in want_c.items() if fresh_row(k)})
            got_c = Counter({k: n for k, n in got_c.items() if fresh_row(k)})
        want, got = dict(want_c), dict(got_c)
        semantics = "multiset of records"
    why = ("a finding keeps history computed the old way: output keys holding a value "
           "first produced after the restart equal the reference's"
           if history else
           "the restarted output over the later input equals the new plan's as if it had "
           "always run")
    # nothing on either side: the restart "keeps" a promise no row tested
    judged = {"rule": rule, "semantics": semantics, "why": why,
              "compared": len(want), "restarted": len(got),
              "vacuous": not want and not got}
    return Judgement("starts_correct" if want == got else "starts_wrong", judged=judged,
                     expected=want, got=got)


def error_class(text: str) -> str:
    """Spark's error class in a query's error text (``[STATE_STORE_..._NOT_COMPATIBLE]``),
    else its first line."""
    names = [n for n in re.findall(r"\[([A-Z][A-Z_]{8,})\]", text)
             if n not in ("STREAM_FAILED",)]
    if names:
        return names[0]
    # no class: the exception's own words, without the run's query ids
    first = (text.splitlines() or [""])[0]
    return first.split("terminated with exception: ", 1)[-1][:200]


def has_error_class(text: str | None) -> bool:
    return bool(text) and re.fullmatch(r"[A-Z][A-Z_]{8,}", text or "") is not None


def first_lines(text: str, n: int = 3) -> str:
    """Spark's message without its stack trace."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(("\tat ",
                                                                                   "  at "))]
    return "\n".join(lines[:n])[:1500]


#: Spark's outcome in the words of the checker's predicted restart
_PREDICTED = {"fails": "fails", "starts_correct": "starts", "starts_wrong": "wrong_state"}


def agreement(verdict: str, outcome: str, error_cls: str | None,
              predicted: dict[str, Any] | None, vacuous: bool = False) -> dict[str, Any]:
    """Does Spark agree?  ``identical``/``in_place`` promise a correct start; ``migrate`` and
    ``unsupported`` say an in-place restart is wrong, so Spark agrees when it fails or
    starts wrong (a correct start there is a disagreement, but a ``conservative`` one).
    The checker's predicted restart agrees when it names Spark's outcome (and, for a
    failure, its error class).

    A ``vacuous`` proof (Spark started, no row compared) says nothing of the promise: it
    neither agrees nor disagrees with the verdict (``verdict_agrees`` None), so it is never
    counted as agreement, as a false green or as a conservative verdict."""
    green = verdict in GREEN
    vacuous = vacuous and outcome == "starts_correct"
    verdict_agrees = None if vacuous else (outcome == "starts_correct") == green
    out: dict[str, Any] = {"verdict_agrees": verdict_agrees,
                           "false_green": green and verdict_agrees is False,
                           "conservative": not green and verdict_agrees is False,
                           "vacuous": vacuous}
    if predicted is None or (vacuous and predicted.get("outcome") == "wrong_state"):
        # with no row compared, a predicted wrong state is neither shown nor refuted
        out["prediction_agrees"] = None
    else:
        same = predicted.get("outcome") == _PREDICTED[outcome]
        if same and outcome == "fails":
            said = predicted.get("error_class")
            # a failure Spark raises with no error class (the checker says what it is in
            # parentheses: a wrong number of sources, a topic without offsets) agrees with
            # any classless failure; a class must be Spark's
            same = said == error_cls or (not has_error_class(said)
                                         and not has_error_class(error_cls))
        out["prediction_agrees"] = same
    out["agrees"] = bool(verdict_agrees) and out["prediction_agrees"] is not False
    return out


# -- the runtime ----------------------------------------------------------------------------

#: a topic's records (key JSON or None, value) and the partitions it is produced over
Batch = tuple[str, Sequence[tuple[str | None, str | bytes]], int]

class Runtime(Protocol):
    """Where the plans run: :class:`SparkRuntime` (``theseus run``'s builder),
    :class:`PySparkRuntime` (the plans as plain PySpark jobs on Spark's own Kafka
    connector), or a fake in the unit tests."""

    #: ``theseus`` or ``spark`` (``--runtime``)
    name: str

    def create_topic(self, name: str, partitions: int) -> None: ...

    def grow(self, name: str, partitions: int) -> None: ...

    def produce_all(self, batches: Sequence[Batch]) -> None:
        """Produce every topic's records of ``batches`` as one unit: a query that reads
        committed records sees all of them or none."""

    def start(self, plan: Plan, checkpoint: Path, output: str, name: str) -> Any:
        """Start ``plan`` on ``checkpoint``, running until stopped: the query, or Spark's
        error text when it could not start (a refusal at start is an outcome here)."""

    def drain(self, queries: Sequence[Any]) -> list[str | None]:
        """Wait until each query has processed everything produced so far: None, or
        Spark's error text (the query failed; an error text from start stays)."""

    def stop(self, query: Any) -> None: ...

    def read(self, topic: str) -> list[Out]: ...

    def predict(self, checkpoint: Path, new_path: str) -> dict[str, Any]: ...


@dataclass
class Proof:
    report: Report
    judgement: Judgement
    agreement: dict[str, Any]
    predicted: dict[str, Any] | None
    counts: dict[str, int]
    timings: dict[str, float]
    seed: int
    records: int
    runtime: str = "theseus"

    @property
    def exit_code(self) -> int:
        a = self.agreement
        if a["agrees"]:
            return 0
        # a contradicted prediction is a disagreement even where no row was compared
        return VACUOUS_EXIT if a["vacuous"] and a["prediction_agrees"] is not False \
            else DISAGREES_EXIT

    def to_json(self) -> dict[str, Any]:
        j = self.judgement
        return {"verdict": self.report.verdict, "outcome": j.outcome,
                "error_class": j.error_class, "error": j.error,
                **self.agreement,
                "predicted": self.predicted, "judged": j.judged,
                "findings": [{"code": f.code, "effect": f.effect, "history": f.history}
                             for f in self.report.findings if f.effect != "none"],
                "counts": self.counts, "timings": self.timings,
                "runtime": self.runtime, "seed": self.seed, "records": self.records,
                "differences": differences(j) if j.outcome == "starts_wrong" else []}


def differences(j: Judgement, limit: int = 5) -> list[str]:
    """A short sample of what differs: per key, the fields that differ in deepdiff's words
    (imported here only); for an append output, the records missing or in excess."""
    lines: list[str] = []
    want, got = j.expected or {}, j.got or {}
    if j.judged.get("semantics") == "multiset of records":
        for k in sorted(set(want) | set(got)):
            n = want.get(k, 0) - got.get(k, 0)
            if n > 0:
                lines.append(f"missing ({n}x): {k}")
            elif n < 0:
                lines.append(f"not expected ({-n}x): {k}")
    else:
        from deepdiff import DeepDiff

        for k in sorted(set(want) | set(got)):
            if k not in got:
                lines.append(f"key {k}: not written; expected {_text(want[k])}")
            elif k not in want:
                lines.append(f"key {k}: written {_text(got[k])}; not expected")
            elif want[k] != got[k]:
                diff = DeepDiff(want[k], got[k], threshold_to_diff_deeper=0).pretty()
                lines.append(f"key {k}: " + "; ".join(diff.splitlines()))
    return lines[:limit] + ([f"... and {len(lines) - limit} more"] if len(lines) > limit
                            else [])


def _rewrite(plan: Plan, topics: dict[str, str], path: Path, *, first_start: bool = False
             ) -> Plan:
    """``plan`` reading the run's own topics, written to ``path`` (the checkpoint check and
    Spark read it from there).  A job file is copied beside it with the topics' new names
    (:func:`job_file`): ``--runtime spark`` runs the job itself, not its export.

    ``first_start``: the plan's first start is OLD's or the reference's, as if they had run
    before any input: a source's ``latest`` starting offsets then are the topic's
    beginning (the run's topics are made empty), not the end of part 1's first chunk,
    produced before they start."""
    doc = json.loads(dumps(plan))
    for node in doc["nodes"]:
        if node.get("step") == "source":
            if node.get("format") == "avro":
                # the record the plan reads keeps its name (derived from the topic's when
                # the plan names none): Avro resolves records by name
                from compat.avro import record_name

                spec = node.get("avro") or {}
                spec.setdefault("record", record_name(node["topic"]))
                node["avro"] = spec
            node["topic"] = topics[node["topic"]]
            if first_start:
                node.pop("starting_offsets", None)
    path.write_text(json.dumps(doc, indent=1))
    if plan.file and plan.file.endswith(".py"):
        shutil.copyfile(plan.file, path.with_suffix(".py"))
        path.with_suffix(".topics.json").write_text(json.dumps(topics))
    return load_plan(str(path))


def job_file(plan: Plan) -> tuple[Path, dict[str, str]] | None:
    """The job file a rewritten plan came from and its topics' new names, or None (the plan
    was JSON or SQL: ``--runtime spark`` runs its export)."""
    if not plan.file:
        return None
    job = Path(plan.file).with_suffix(".py")
    names = Path(plan.file).with_suffix(".topics.json")
    if not job.is_file() or not names.is_file():
        return None
    return job, json.loads(names.read_text())


def refuse_unrunnable(plan: Plan, side: str, runtime_name: str = "theseus") -> None:
    """Plans whose input this generator cannot make meaningful, a new plan whose output
    no second run reproduces (rand(), uuid()...): nothing to judge it against, and under
    ``--runtime spark`` a plan that cannot be written as a PySpark job."""
    if runtime_name == "spark":
        from compat.export import exportable

        why = exportable(plan)
        if why is not None:
            raise Refused("--runtime spark runs each plan as the PySpark job `plan export "
                          f"--pyspark` writes, and {side} plan cannot be written as one: "
                          f"{why}", file=plan.file, expected="a plan the DataFrame API "
                          "can say (or --runtime theseus)", found=why.split(":")[0])
    if side == "the new":
        for nid, info in plan.info.items():
            if not info.deterministic:
                raise Refused("prove cannot judge a nondeterministic plan: two runs over "
                              "the same input write different output", file=plan.file,
                              node=nid, pointer=plan.pointer(nid),
                              expected="a deterministic new plan",
                              found="a nondeterministic expression")
    for nid, node in plan.nodes.items():
        if node.step == "recursive":
            raise Refused("prove cannot generate input for a recursive step yet (its limit "
                          "and feedback need input shaped for them)", file=plan.file,
                          node=nid, pointer=plan.pointer(nid),
                          expected="plans without recursive steps", found=f"{side} plan")


def avro_registry(old: Plan, new: Plan, runtime_name: str = "theseus") -> Any:
    """The registry client that Avro input is produced through (None when no source or
    sink of either plan is Avro); refuses what prove cannot run on Avro topics."""
    from compat.steps import Sink, Source

    avro = [(p, n) for p in (old, new) for n in p.nodes.values()
            if isinstance(n, (Source, Sink)) and n.format == "avro"]
    if not avro:
        return None
    plan, node = avro[0]
    where = {"file": plan.file, "node": node.id, "pointer": plan.pointer(node.id, "format")}
    if runtime_name == "spark":
        raise Refused("--runtime spark runs the exported jobs, which read an Avro topic "
                      "with from_avro over one fixed schema: the two plans' jobs cannot "
                      "both read one generated input unless their schemas are the same, "
                      "and prove's session has no spark-avro", **where,
                      expected="--runtime theseus for plans on Avro topics",
                      found="--runtime spark")
    formats: dict[str, set[str]] = {}
    for p in (old, new):
        for n in p.nodes.values():
            if isinstance(n, Source):
                formats.setdefault(n.topic, set()).add(n.format)
                if n.format == "avro" and n.avro is not None and n.avro.key:
                    raise Refused("prove cannot generate Avro record keys yet (avro.key)",
                                  file=p.file, node=n.id,
                                  pointer=p.pointer(n.id, "avro/key"),
                                  expected="sources whose keys are JSON",
                                  found="avro.key true")
    for topic, fmts in formats.items():
        if "avro" in fmts and len(fmts) > 1:
            raise Refused(f"the plans read topic '{topic}' as {' and '.join(sorted(fmts))}: "
                          "prove generates one input that both read", **where,
                          expected="one format per source topic",
                          found=", ".join(sorted(fmts)))
    from compat.registry import RegistryClient
    from gates.kafkaconf import registry_settings

    client = RegistryClient.configured(None, registry_settings())
    if client is None:
        raise Refused("prove produces the Avro input through a schema registry, and none "
                      "is named", **where, expected="SCHEMA_REGISTRY_URL, or "
                      "schema.registry.url in --kafka-config", found="neither")
    return client


def avro_values(spec: TopicSpec, topic: str, client: Any) -> Any:
    """A function of a generated row: its value in the registry's wire format, the
    topic's writer schema registered under ``<topic>-value`` (as a producer's would be)."""
    from compat import avro as A
    from gates.avro import AvroEncoder, datum

    assert spec.avro is not None
    schema = A.parse(spec.avro)
    enc = AvroEncoder(f"{topic}-value", spec.avro, client)
    return lambda row: enc.encode(datum(schema, row))


def readable(outs: list[Out], client: Any) -> list[Out]:
    """An output read back with Avro values (and keys) as JSON text, each by the writer
    schema its id names: the judgement compares rows, not schema ids."""
    if client is None:
        return outs
    from gates.avro import AvroDecoder

    dec = AvroDecoder("prove output", None, client)

    def text(raw: bytes | None, o: Out) -> bytes | None:
        if raw is None or raw[:1] != b"\x00":
            return raw
        doc = dec.decode(raw, o.partition, o.offset)
        return json.dumps(doc, sort_keys=True, separators=(",", ":"),
                          default=str).encode()

    return [Out(o.partition, o.offset, text(o.key, o), text(o.value, o)) for o in outs]


def prove(old_path: str, new_path: str, runtime: Runtime, *, seed: int = 0,
          records: int = 120, workdir: str | None = None,
          state_partitions: int | None = None) -> Proof:
    """``state_partitions``: run both plans with this many state partitions where they
    ask for the same count (a plan's own count is kept where the change is to it).  The
    count pinned in the checkpoint is then the same for OLD, the restart and the reference,
    as it is with the plans' own; a proof of a few hundred records gains nothing from
    eight RocksDB instances per operator and batch, and ``make truth`` runs with 2."""
    timings: dict[str, float] = {}
    started = time.monotonic()
    # Step 1. The plans and the verdict.
    old, new = load_plan(old_path), load_plan(new_path)
    report = check_plans(old, new)
    if state_partitions is not None and old.state_partitions == new.state_partitions:
        old, new = (replace(p, config={**p.config, "state_partitions": state_partitions})
                    for p in (old, new))
    refuse_unrunnable(old, "the old", runtime.name)
    refuse_unrunnable(new, "the new", runtime.name)
    registry = avro_registry(old, new, runtime.name)
    # Step 2. The input.
    specs = source_topics(old, new)
    strings, numbers = literals([old, new])
    data = generate(specs, strings, numbers, seed=seed, records=records,
                    distinct=distinct_columns([old, new]),
                    compared=compared_literals([old, new]))
    timings["check_and_generate"] = round(time.monotonic() - started, 2)
    own = tempfile.mkdtemp(prefix="theseus-prove-") if workdir is None else None
    work = Path(workdir or own or ".")
    try:
        return _prove(report, old, new, runtime, data, work, seed, records, timings,
                      registry)
    finally:
        if own is not None:
            shutil.rmtree(own, ignore_errors=True)


def _prove(report: Report, old: Plan, new: Plan, runtime: Runtime, data: Input, work: Path,
           seed: int, records: int, timings: dict[str, float], registry: Any = None
           ) -> Proof:
    # Step 3. Topics of the run's own.
    t_topics = time.monotonic()
    rid = uuid.uuid4().hex[:8]
    names = {t: f"theseus-prove-{rid}-{t}" for t in data.topics}
    # The reference has always run with the new plan's partition count: where that is not
    # the old one, it reads a topic of its own, made with it, that gets the same records.
    ref_names = {t: names[t] if spec.new_partitions == spec.partitions else
                 f"{names[t]}-reference" for t, spec in data.topics.items()}
    for t, spec in data.topics.items():
        runtime.create_topic(names[t], spec.partitions)
        if ref_names[t] != names[t]:
            runtime.create_topic(ref_names[t], spec.new_partitions)
    outs = {k: f"theseus-prove-{rid}-out-{k}" for k in ("old", "restart", "reference")}
    for o in outs.values():
        runtime.create_topic(o, 2)
    timings["topics"] = round(time.monotonic() - t_topics, 2)
    old_r = _rewrite(old, names, work / "old.json", first_start=True)
    new_r = _rewrite(new, names, work / "new.json")
    latest = any(getattr(n, "starting_offsets", None) == "latest" for n in new.nodes.values())
    ref_r = new_r if ref_names == names and not latest else _rewrite(
        new, ref_names, work / "reference.json", first_start=True)
    ck_old, ck_ref, ck_new = work / "ck-old", work / "ck-reference", work / "ck-restart"

    # an Avro topic's records in the wire format, its schema registered (Avro readers
    # need no subject: each record names its schema by id)
    encoders = {t: avro_values(spec, names[t], registry)
                for t, spec in data.topics.items() if spec.avro is not None}

    def produce(rows: Sequence[tuple[str, str | None, dict[str, Any]]], grown: bool) -> None:
        by_topic: dict[str, list[tuple[str | None, str | bytes]]] = {}
        for t, k, v in rows:
            by_topic.setdefault(t, []).append(
                (k, encoders[t](v) if t in encoders else json.dumps(v, separators=(",", ":"))))
        batches: list[Batch] = []
        for t, recs in by_topic.items():
            spec = data.topics[t]
            batches.append((names[t], recs, spec.new_partitions if grown else spec.partitions))
            if ref_names[t] != names[t]:
                batches.append((ref_names[t], recs, spec.new_partitions))
        runtime.produce_all(batches)

    def must(err: str | None, what: str, plan: Plan) -> None:
        if err is not None:
            raise RuntimeFailure(f"{what} failed on the generated input, before any "
                                 f"restart: {error_class(err)}: {first_lines(err, 1)}",
                                 file=plan.file,
                                 hint="prove needs both plans to run from scratch")

    running: list[Any] = []

    def start(plan: Plan, ck: Path, out: str, who: str) -> Any:
        q = runtime.start(plan, ck, out, f"prove-{rid}-{who}")
        running.append(q)
        return q

    def stop(q: Any) -> None:
        running.remove(q)
        runtime.stop(q)

    try:
        # Step 4. OLD and the reference over part 1, chunk by chunk, each query started once.
        t = time.monotonic()
        produce(data.chunks[0], False)
        q_old = start(old_r, ck_old, outs["old"], "old")
        q_ref = start(ref_r, ck_ref, outs["reference"], "ref")
        for i, chunk in enumerate(data.chunks):
            if i:
                produce(chunk, False)
            old_err, ref_err = runtime.drain([q_old, q_ref])
            must(old_err, "the old plan", old)
            must(ref_err, "the new plan", new)
        stop(q_old)
        timings["part1"] = round(time.monotonic() - t, 2)

        def read(topic: str) -> list[Out]:
            t = time.monotonic()
            try:
                return readable(runtime.read(topic), registry)
            finally:
                spent = time.monotonic() - t
                timings["reads"] = round(timings.get("reads", 0.0) + spent, 2)

        ref_before = {(r.partition, r.offset) for r in read(outs["reference"])}
        old_out = read(outs["old"])
        # Step 5. The checker's prediction, on the untouched checkpoint.
        shutil.copytree(ck_old, ck_new)
        t = time.monotonic()
        predicted = runtime.predict(ck_old, str(work / "new.json"))
        timings["predict"] = round(time.monotonic() - t, 2)
        # Step 6. Part 2: the restart, and the reference.
        for tn, spec in data.topics.items():
            if spec.new_partitions > spec.partitions:
                runtime.grow(names[tn], spec.new_partitions)
        produce(data.part2, True)
        t = time.monotonic()
        q_new = start(new_r, ck_new, outs["restart"], "restart")
        err, ref_err = runtime.drain([q_new, q_ref])
        timings["restart_and_reference"] = round(time.monotonic() - t, 2)
    finally:
        for q in list(running):
            stop(q)
    must(ref_err, "the new plan", new)
    restarted = read(outs["restart"]) if err is None else []
    ref_all = read(outs["reference"])
    reference = [r for r in ref_all if (r.partition, r.offset) not in ref_before]
    # Step 7. The judgement.
    j = judge(report, err, restarted, reference, old_out,
              [r for r in ref_all if (r.partition, r.offset) in ref_before])
    agree = agreement(report.verdict, j.outcome, j.error_class, predicted,
                      vacuous=bool(j.judged.get("vacuous")))
    counts = {"input_part1": sum(len(c) for c in data.chunks),
              # the micro-batches OLD committed to its checkpoint, no-data batches too
              "old_batches": sum(1 for f in (ck_old / "commits").glob("*")
                                 if f.name.isdigit()),
              "input_part2": len(data.part2), "old_output": len(old_out),
              "restart_output": len(restarted), "reference_output_part2": len(reference)}
    timings["total"] = round(sum(v for k, v in timings.items() if k != "total"), 2)
    return Proof(report, j, agree, predicted, counts, timings, seed, records, runtime.name)


# -- output ---------------------------------------------------------------------------------

_OUTCOME_TEXT = {
    "fails": "Spark refuses to restart the new plan on the old checkpoint",
    "starts_correct": "Spark restarts the new plan on the old checkpoint, and its output "
                      "keeps the verdict's promise",
    "starts_wrong": "Spark restarts the new plan on the old checkpoint, but its output "
                    "breaks the verdict's promise",
}


def render_text(p: Proof) -> str:
    doc = p.to_json()
    lines = [f"verdict: {doc['verdict']} (theseus check); runtime: {doc['runtime']}",
             f"restart: {doc['outcome']} — "
             + ("Spark restarts the new plan on the old checkpoint; no row was compared, so "
                "nothing shows whether its output keeps the verdict's promise"
                if doc["vacuous"] else _OUTCOME_TEXT[doc["outcome"]])]
    if doc["outcome"] == "fails":
        lines.append(f"  error class: {doc['error_class']}")
        lines += [f"  | {ln}" for ln in (doc["error"] or "").splitlines()]
    judged = doc["judged"]
    if judged:
        lines.append(f"  judged: {judged['rule']} ({judged['semantics']}; "
                     f"{judged['compared']} expected, {judged['restarted']} written): "
                     f"{judged['why']}")
        if judged["vacuous"]:
            lines.append("  (nothing was compared: the generated input left no output to "
                         "judge; try another --seed or more --records)")
    if doc["differences"]:
        lines.append("  differences (expected: the new plan as if it had always run):")
        lines += [f"    {d}" for d in doc["differences"]]
    pred = doc["predicted"]
    if pred is not None:
        said = pred.get("outcome", "?") + (f" ({pred['error_class']})"
                                           if pred.get("error_class") else "")
        lines.append(f"predicted restart (check --checkpoint): {said}"
                     + ("" if doc["prediction_agrees"] else " — not what Spark did"))
    if doc["agrees"]:
        lines.append(f"Spark agrees with the verdict (exit {p.exit_code})")
    elif doc["vacuous"] and doc["prediction_agrees"] is not False:
        lines.append(f"Vacuous: Spark restarts, but no row was compared, so the proof neither "
                     f"confirms nor contradicts the verdict {doc['verdict']} "
                     f"(exit {p.exit_code})")
    elif doc["false_green"]:
        lines.append(f"Spark DISAGREES: the verdict says {doc['verdict']}, but the restart "
                     f"{doc['outcome'].replace('_', ' ')} (a false green; exit "
                     f"{p.exit_code})")
    elif doc["conservative"]:
        lines.append(f"Spark disagrees, conservatively: the verdict says {doc['verdict']}, "
                     f"yet the restart keeps the promise (exit {p.exit_code})")
    else:
        what = "predicted restart" if doc["verdict_agrees"] is not False else "verdict"
        lines.append(f"Spark disagrees with the {what} (exit {p.exit_code})")
    c = doc["counts"]
    lines.append(f"input: {c['input_part1']} records before the restart ({CHUNKS} batches), "
                 f"{c['input_part2']} after (seed {p.seed}); {doc['timings']['total']} s")
    return "\n".join(lines) + "\n"


def render(p: Proof, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(p.to_json(), indent=2, default=str) + "\n"
    return render_text(p)


# -- Spark and Kafka ------------------------------------------------------------------------

class SparkRuntime:
    """Runs plans with ``theseus run``'s builder on local Spark, against a broker."""

    name = "theseus"

    def __init__(self, bootstrap: str, spark: Any = None, timeout: float = 180.0) -> None:
        self.bootstrap = bootstrap
        self.timeout = timeout
        self._spark = spark
        self._producer: Any = None
        #: the committed end offsets of every topic produced to, {topic: {partition: end}}
        self.ends: dict[str, dict[int, int]] = {}

    @property
    def spark(self) -> Any:
        if self._spark is None:
            from migrate.run import spark_session

            self._spark = spark_session()
        return self._spark

    def create_topic(self, name: str, partitions: int) -> None:
        from gates.broker import create_topic

        create_topic(self.bootstrap, name, partitions)

    def grow(self, name: str, partitions: int) -> None:
        from confluent_kafka.admin import AdminClient, NewPartitions

        from gates.broker import client_conf
        from gates.deadline import Deadline

        admin = AdminClient(client_conf(self.bootstrap))
        admin.create_partitions([NewPartitions(name, partitions)])[name].result(30)
        # the producer's own metadata must know the new partitions before part 2 is
        # produced to them (a fixed 2 s wait was not enough with a second proof beside
        # this one: "Unknown partition"); a metadata request of its own refreshes it
        producer, deadline = self._transactional(), Deadline(30)
        while len(producer.list_topics(name, timeout=10).topics[name].partitions) < \
                partitions and not deadline.expired():
            time.sleep(0.2)
        time.sleep(1)  # the queries' consumers, which list the partitions at each batch

    def produce_all(self, batches: Sequence[Batch]) -> None:
        # One transaction: the queries read committed records only (the gated source by
        # default, Spark's connector by :func:`read_committed_kafka`), so a running query's
        # micro-batch never takes part of a chunk, whose later records would then come
        # after the watermark had moved past the earlier ones' times.
        from confluent_kafka import KafkaException

        p = self._transactional()
        p.begin_transaction()
        failed: list[Any] = []
        try:
            for topic, records, partitions in batches:
                for i, (k, v) in enumerate(records):
                    # by key when keyed (a key's records stay in order), else round
                    # robin: deterministic, so two runs of one seed read the same
                    # partitions
                    part = (zlib.crc32(k.encode()) % partitions if k is not None
                            else i % partitions)
                    p.produce(topic, value=v if isinstance(v, bytes) else v.encode(),
                              key=None if k is None else k.encode(), partition=part,
                              on_delivery=lambda err, msg: failed.append(err) if err
                              else None)
                    p.poll(0)
            p.commit_transaction(60)
        except KafkaException as e:
            failed.append(e)
        if failed:
            from compat.errors import BrokerError

            self._producer = None  # a failed transaction leaves the producer unusable
            raise BrokerError("cannot produce the generated input",
                              topic=", ".join(t for t, _, _ in batches),
                              expected="every record delivered in one transaction",
                              found=f"errors {failed[:3]}")
        # the commit returns before its markers move the last stable offsets: what the
        # queries must have read once drained is known when they have moved
        self.ends.update(stable_ends(self.bootstrap, [t for t, _, _ in batches]))

    def _transactional(self) -> Any:
        if self._producer is None:
            from confluent_kafka import Producer

            from gates.broker import client_conf

            self._producer = Producer(client_conf(self.bootstrap, **{
                "transactional.id": f"theseus-prove-{uuid.uuid4().hex}",
                "linger.ms": 5}))
            self._producer.init_transactions(60)
        return self._producer

    def start(self, plan: Plan, checkpoint: Path, output: str, name: str) -> Any:
        """The started query, or Spark's error text (``start_query``)."""
        return start_query(self.spark, plan, self.bootstrap, checkpoint, output, name)

    def drain(self, queries: Sequence[Any]) -> list[str | None]:
        # The queries run side by side; each is waited for in turn.
        return [process_available(q, self.ends, self.timeout) for q in queries]

    def stop(self, query: Any) -> None:
        if not isinstance(query, str):
            query.stop()

    def read(self, topic: str) -> list[Out]:
        return read_committed(self.bootstrap, topic)

    def predict(self, checkpoint: Path, new_path: str) -> dict[str, Any]:
        from migrate.ckcheck import check_checkpoint

        with SESSION:
            rep = check_checkpoint(str(checkpoint), new_path, spark=self.spark)
        restart = dict((rep.checkpoint or {}).get("restart") or {})
        restart["verdict"] = rep.verdict
        # which source wrote OLD's checkpoint: the dry run planned that form of NEW
        restart["written_by"] = (rep.checkpoint or {}).get("written_by")
        return restart


class PySparkRuntime(SparkRuntime):
    """Runs plans as plain PySpark jobs on Spark's own Kafka connector, as users who keep
    their jobs and use Theseus only as the CI gate do: each plan is written by ``plan export
    --pyspark`` (a job file is run itself, its Kafka reads redirected to the run's topics and
    broker: ``migrate.jobsession``) and its ``build(spark)`` started with the run's
    checkpoint, output topic and a processing-time trigger (reading committed records
    only: :func:`read_committed_kafka`).  The checkpoint is then
    Spark's Kafka source's, not the gated source's: the checker's prediction is judged on
    that kind of checkpoint too."""

    name = "spark"

    @property
    def spark(self) -> Any:
        if self._spark is None:
            from migrate.adopt.jars import connector_jars
            from migrate.run import spark_session

            self._spark = spark_session(jars=connector_jars())
        if not has_kafka_connector(self._spark):
            raise RuntimeFailure("--runtime spark needs Spark's Kafka connector on the "
                                 "session's class path", expected="spark-sql-kafka-0-10 "
                                 "(migrate.adopt.jars.connector_jars())",
                                 found="a session started without it",
                                 hint="run theseus prove in a process of its own")
        return self._spark

    def start(self, plan: Plan, checkpoint: Path, output: str, name: str) -> Any:
        spark = self.spark
        mine = job_file(plan)
        with SESSION:
            return self._start(spark, plan, mine, checkpoint, output, name)

    def _start(self, spark: Any, plan: Plan, mine: tuple[Path, dict[str, str]] | None,
               checkpoint: Path, output: str, name: str) -> Any:
        from migrate.jobsession import plain, redirected, writer_of

        try:
            if mine is None:
                writer = writer_of(pyspark_job(plan, self.bootstrap, checkpoint), spark,
                                   read_committed_kafka(plain))
            else:
                # the user's job as written, its reads redirected to the run's topics
                path, topics = mine
                job: dict[str, Any] = {"__name__": f"theseus_prove_{plan.query}",
                                       "__file__": str(path)}
                exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), job)
                # spark-submit's conf or the job's caller sets the sink's broker
                # and checkpoint: a job file need not
                writer = (writer_of(job, spark, read_committed_kafka(
                    redirected(self.bootstrap, topics)))
                          .option("kafka.bootstrap.servers", self.bootstrap)
                          .option("checkpointLocation", str(checkpoint)))
            return (writer.option("topic", output).queryName(name)
                    .trigger(processingTime=TRIGGER).start())
        except Exception as e:  # noqa: BLE001 - a refusal at start is what is measured here
            return str(e)


def pyspark_job(plan: Plan, bootstrap: str, checkpoint: Path) -> dict[str, Any]:
    """The module of the job ``plan export --pyspark`` writes for ``plan``, its globals
    pointing at the run's broker and checkpoint (``build()`` reads them when it runs,
    where a user's job reads ``$KAFKA_BOOTSTRAP`` and ``$CHECKPOINT``)."""
    from compat.export import to_pyspark

    job: dict[str, Any] = {"__name__": f"theseus_prove_{plan.query}"}
    exec(compile(to_pyspark(plan), f"{plan.file} as a PySpark job", "exec"), job)
    job["BOOTSTRAP"], job["CHECKPOINT"] = bootstrap, str(checkpoint)
    return job


def has_kafka_connector(spark: Any) -> bool:
    from migrate.adopt.job import _has_kafka

    return _has_kafka(spark)


RUNTIMES = {"theseus": SparkRuntime, "spark": PySparkRuntime}


def runtime(bootstrap: str, name: str = "theseus") -> Runtime:
    """The runtime ``theseus prove --runtime NAME`` uses (the tests put a fake in its
    place)."""
    return RUNTIMES[name](bootstrap)


def read_committed_kafka(load: Load) -> Load:
    """``load`` with Spark's Kafka source reading committed records only: prove produces
    each chunk in one transaction, and under read_committed the connector lists the last
    stable offsets too, so a micro-batch holds whole chunks (a user's job keeps its own
    isolation level; the checkpoint does not record it)."""

    def committed(reader: Any, fmt: str | None, options: dict[str, str]) -> Any:
        if fmt == "kafka":
            options["kafka.isolation.level"] = "read_committed"
        return load(reader, fmt, options)

    return committed


def start_query(spark: Any, plan: Plan, bootstrap: str, checkpoint: Path, output: str,
                name: str, *, available_now: bool = False) -> Any:
    """Start ``plan`` on ``checkpoint`` into ``output``, on a processing-time trigger (or
    availableNow): the running query, or Spark's error text when it could not start (a
    refusal at start is an outcome here)."""
    from migrate.build import Builder, BuildOptions

    # a streaming query copies the session's conf when it starts: the next start may change it
    with SESSION:
        spark.conf.set("spark.sql.shuffle.partitions", str(plan.state_partitions or 4))
        try:
            return Builder(spark, plan, BuildOptions(bootstrap=bootstrap,
                                                     available_now=available_now,
                                                     trigger_interval=TRIGGER,
                                                     checkpoint=str(checkpoint),
                                                     output_topic=output, query=name)).start()
        except Exception as e:  # noqa: BLE001 - a refusal at start is what is measured here
            return str(e)


def start_available_now(spark: Any, plan: Plan, bootstrap: str, checkpoint: Path,
                        output: str, name: str) -> Any:
    """Start ``plan`` availableNow on ``checkpoint`` into ``output`` (``start_query``)."""
    return start_query(spark, plan, bootstrap, checkpoint, output, name, available_now=True)


def process_available(q: Any, ends: dict[str, dict[int, int]] | None = None,
                      timeout: float = 180.0) -> str | None:
    """None once the running query ``start_query`` gave has processed everything
    available (``processAllAvailable``: the no-data batches a moved watermark asks for
    too) up to ``ends`` (:func:`caught_up`), else Spark's error text; a query still busy
    after ``timeout`` is stopped."""
    if isinstance(q, str):
        return q
    from gates.deadline import Deadline

    deadline = Deadline(timeout)
    while True:
        failed = _process_all_available(q, max(deadline.remaining(), 0.1))
        if isinstance(failed, _Busy):
            q.stop()
            return f"did not finish within {timeout:.0f} s"
        if failed is not None:
            return failed
        exc = q.exception()
        if exc is not None:
            return str(exc)
        # processAllAvailable also returns when a trigger that listed the offsets before
        # the last chunk was visible ends after the call: wait again until the query read
        # to the ends
        if caught_up(q.lastProgress, ends or {}):
            return None
        if deadline.expired():
            return f"did not read the input to its end within {timeout:.0f} s"
        time.sleep(0.05)


class _Busy:
    """processAllAvailable still waiting."""


_BUSY = _Busy()


def _process_all_available(q: Any, timeout: float) -> str | _Busy | None:
    """``q.processAllAvailable()``: None, the query's error text, or ``_BUSY`` still
    waiting after ``timeout`` (it has no timeout of its own; stopping the query ends it)."""
    import threading

    failed: list[str] = []

    def wait() -> None:
        try:
            q.processAllAvailable()
        except Exception as e:  # noqa: BLE001 - the query's failure is the outcome
            failed.append(str(e))

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    waiter.join(timeout)
    if waiter.is_alive():
        return _BUSY
    return failed[0] if failed else None


def caught_up(progress: Any, ends: dict[str, dict[int, int]]) -> bool:
    """Whether the end offsets of the micro-batch ``progress`` reports reach ``ends`` on
    every topic it reads that ``ends`` names (its sources' ``endOffset``: the gated
    source's and Spark's Kafka source's are both ``{topic: {partition: offset}}``)."""
    if progress is None:
        return not ends
    for src in progress["sources"]:
        end = src["endOffset"]
        if isinstance(end, str):
            try:
                end = json.loads(end)
            except ValueError:
                continue
        if not isinstance(end, dict):
            continue
        for topic, want in ends.items():
            got = end.get(topic)
            if not isinstance(got, dict):
                continue
            if any(int(got.get(str(p), got.get(p, -1))) < n for p, n in want.items()
                   if n > 0):
                return False
    return True


def stable_ends(bootstrap: str, topics: Sequence[str], timeout: float = 30.0
                ) -> dict[str, dict[int, int]]:
    """The end offsets of ``topics`` once no transaction is open on them (the last stable
    offsets equal the high watermarks), or as they are after ``timeout``."""
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    from gates.broker import client_conf
    from gates.deadline import Deadline

    admin = AdminClient(client_conf(bootstrap))
    meta = admin.list_topics(timeout=timeout).topics
    req = {TopicPartition(t, p): OffsetSpec.latest() for t in dict.fromkeys(topics)
           for p in meta[t].partitions}

    def ends(level: Any) -> dict[tuple[str, int], int]:
        futs = admin.list_offsets(req, isolation_level=level, request_timeout=timeout)
        return {(tp.topic, tp.partition): f.result(timeout=timeout).offset
                for tp, f in futs.items()}

    settle = Deadline(timeout)
    while True:
        end = ends(IsolationLevel.READ_COMMITTED)
        if end == ends(IsolationLevel.READ_UNCOMMITTED) or settle.expired():
            break
        time.sleep(0.02)
    out: dict[str, dict[int, int]] = {}
    for (t, p), n in end.items():
        out.setdefault(t, {})[p] = n
    return out


def await_outcome(q: Any, timeout: float = 180.0) -> str | None:
    """None when the query ``start_available_now`` gave finished, else Spark's error text."""
    if isinstance(q, str):
        return q
    try:
        q.awaitTermination(timeout)
    except Exception as e:  # noqa: BLE001 - the query's failure is the outcome
        return str(e)
    if q.isActive:
        q.stop()
        return f"did not finish within {timeout:.0f} s"
    exc = q.exception()
    return None if exc is None else str(exc)


def read_committed(bootstrap: str, topic: str, timeout: float = 60.0) -> list[Out]:
    """Every committed record of ``topic``, once no transaction is open on it (a sink's
    transaction commit returns before its markers move the last stable offset)."""
    from confluent_kafka import Consumer, IsolationLevel, KafkaError, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    from gates.broker import client_conf
    from gates.deadline import Deadline

    admin = AdminClient(client_conf(bootstrap))
    parts = admin.list_topics(topic, timeout=timeout).topics[topic].partitions

    def ends(level: Any) -> dict[int, int]:
        futs = admin.list_offsets({TopicPartition(topic, p): OffsetSpec.latest()
                                   for p in parts}, isolation_level=level,
                                  request_timeout=timeout)
        return {tp.partition: f.result(timeout=timeout).offset for tp, f in futs.items()}

    settle = Deadline(10)
    while True:
        end = ends(IsolationLevel.READ_COMMITTED)
        if end == ends(IsolationLevel.READ_UNCOMMITTED) or settle.expired():
            break
        time.sleep(0.1)
    todo = {p for p, e in end.items() if e > 0}
    if not todo:
        return []
    c = Consumer(client_conf(bootstrap, **{"group.id": f"theseus-prove-{uuid.uuid4().hex}",
                                           "enable.auto.commit": False,
                                           "isolation.level": "read_committed",
                                           "enable.partition.eof": True,
                                           # a transaction ends in a commit marker, never
                                           # delivered: a partition's end is then its EOF,
                                           # which an empty fetch reports (500 ms by default)
                                           "fetch.wait.max.ms": 10}))
    out: list[Out] = []
    try:
        c.assign([TopicPartition(topic, p, 0) for p in sorted(todo)])
        deadline = Deadline(timeout)
        while todo:
            if deadline.expired():
                raise RuntimeFailure(f"cannot read topic '{topic}' to its end within "
                                     f"{timeout:.0f} s")
            # consume() returns when it has its count or its timeout is out: a short one,
            # or every read of a small topic costs the whole timeout
            for m in c.consume(1000, timeout=0.05):
                if m.error() is not None:
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        if m.offset() >= end[m.partition()]:
                            todo.discard(m.partition())
                        continue
                    raise RuntimeFailure(f"cannot read topic '{topic}': {m.error()}")
                if m.offset() < end[m.partition()]:
                    out.append(Out(m.partition(), m.offset(), m.key(), m.value()))
                if m.offset() >= end[m.partition()] - 1:
                    todo.discard(m.partition())
    finally:
        c.close()
    return out
