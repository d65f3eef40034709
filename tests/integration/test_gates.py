"""Integration tests of the gates: control events, gated source, gate state, exactly-once sink.

Real Kafka (scripts/kafka.sh) and a real local Spark; see conftest.py.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from gates.control import CONTROL_HEADER, is_control, parse_control, write_control_events
from gates.state import GateState, acked_offsets, is_acked, read_ack, read_gate, write_gate

from .conftest import PYTHON, ROOT, jvm_running, run_available_now, spark_env

pytestmark = pytest.mark.integration

SCHEMA = "id BIGINT, ship_id STRING, weight DOUBLE, ts TIMESTAMP"
T0_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z


def _record(i: int) -> dict:
    """Alternate ISO-8601 and epoch-millis timestamps; every 10th record lacks weight."""
    r = {"id": i, "ship_id": f"s{i % 7}", "weight": i * 0.5,
         "ts": (f"2024-01-01T00:00:{i % 60:02d}.250Z" if i % 2 else T0_MS + i)}
    if i % 10 == 0:
        del r["weight"]
    return r


def _expected_ts_us(i: int) -> int:
    return (T0_MS * 1000 + (i % 60) * 1_000_000 + 250_000) if i % 2 else (T0_MS + i) * 1000


def _stream(spark, bootstrap, topic, **opts):
    r = (spark.readStream.format("theseus_kafka").option("bootstrap", bootstrap)
         .option("topic", topic).option("partitions", 3).option("format", "json")
         .option("schema", SCHEMA))
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


class Collector:
    """foreachBatch function collecting (batch_id, rows) on the driver."""

    def __init__(self):
        self.batches: list[tuple[int, list]] = []

    def __call__(self, df, batch_id):
        from pyspark.sql import functions as F

        rows = df.select("id", "ship_id", "weight", F.unix_micros("ts").alias("ts_us")).collect()
        self.batches.append((batch_id, [r.asDict() for r in rows]))

    @property
    def rows(self):
        return [r for _, rs in self.batches for r in rs]

    @property
    def ids(self):
        return [r["id"] for r in self.rows]


# --------------------------------------------------------------------------- control events

def test_control_events_cut_vector(kafka):
    topic_a, topic_b = kafka.topic("ctl-a", 3), kafka.topic("ctl-b", 2)
    kafka.produce(topic_a, [{"id": i} for i in range(9)])
    cut = write_control_events(kafka.bootstrap, [topic_a, topic_b], "mig-1")
    assert cut == {topic_a: {0: 3, 1: 3, 2: 3}, topic_b: {0: 0, 1: 0}}
    recs = [r for r in kafka.read_all(topic_a) + kafka.read_all(topic_b) if is_control(r.headers)]
    assert len(recs) == 5
    for r in recs:
        doc = parse_control(r.headers)
        assert doc == {"migration": "mig-1", "topic": r.topic, "partition": r.partition,
                       "count": 5}
        assert cut[r.topic][r.partition] == r.offset
    assert not is_control(None) and not is_control([("other", b"x")])
    assert parse_control([(CONTROL_HEADER, b"not json")]) == {}


# --------------------------------------------------------------------------- (a) source

def test_source_reads_every_record_once(spark, kafka, tmp_path):
    topic = kafka.topic("src", 3)
    kafka.produce(topic, [_record(i) for i in range(600)])
    write_control_events(kafka.bootstrap, [topic], "mig-a")
    kafka.produce(topic, [_record(i) for i in range(600, 900)])

    ck = tmp_path / "ck"
    col = Collector()
    run_available_now(_stream(spark, kafka.bootstrap, topic, maxRecordsPerBatch=250), ck, col)
    assert sorted(col.ids) == list(range(900)), "every record exactly once, no control event"
    sizes = [len(rs) for _, rs in col.batches if rs]
    assert len(sizes) >= 4 and max(sizes) <= 250, sizes  # 903 offsets, 250 per batch
    by_id = {r["id"]: r for r in col.rows}
    for i in (0, 1, 2, 3, 10, 11, 599, 899):
        assert by_id[i]["ts_us"] == _expected_ts_us(i), i
        assert by_id[i]["ship_id"] == f"s{i % 7}"
        assert by_id[i]["weight"] == (None if i % 10 == 0 else i * 0.5)

    # More records (and another cut) between two runs on the same checkpoint.
    kafka.produce(topic, [_record(i) for i in range(900, 1000)])
    write_control_events(kafka.bootstrap, [topic], "mig-b")
    kafka.produce(topic, [_record(i) for i in range(1000, 1050)])
    col2 = Collector()
    run_available_now(_stream(spark, kafka.bootstrap, topic, maxRecordsPerBatch=250), ck, col2)
    assert sorted(col2.ids) == list(range(900, 1050))
    assert min(bid for bid, _ in col2.batches) > max(bid for bid, _ in col.batches)


def test_source_malformed_and_string_format(spark, kafka, tmp_path):
    topic = kafka.topic("odd", 1)
    kafka.produce(topic, ['{"id": 1, "ship_id": 7, "weight": "2.5", "ts": "bad"}',
                          "not json", None, '[1, 2]', {"id": 2.0, "weight": True}], partition=0)
    col = Collector()
    run_available_now(_stream(spark, kafka.bootstrap, topic, partitions=1), tmp_path / "ck", col)
    assert col.rows == [
        {"id": 1, "ship_id": "7", "weight": 2.5, "ts_us": None},
        {"id": None, "ship_id": None, "weight": None, "ts_us": None},  # not JSON
        {"id": None, "ship_id": None, "weight": None, "ts_us": None},  # not an object
        {"id": 2, "ship_id": None, "weight": None, "ts_us": None},
    ]  # the tombstone is skipped

    got = []
    df = (spark.readStream.format("theseus_kafka").option("bootstrap", kafka.bootstrap)
          .option("topic", topic).option("format", "string").load())
    run_available_now(df, tmp_path / "ck2", lambda d, b: got.extend(r.value for r in d.collect()))
    assert got == ['{"id": 1, "ship_id": 7, "weight": "2.5", "ts": "bad"}', "not json",
                   "[1, 2]", '{"id":2.0,"weight":true}']


def test_arrow_and_python_json_paths_agree():
    """The Arrow JSON fast path and the per-record Python path give identical batches."""
    from pyspark.sql.types import (
        ArrayType,
        DecimalType,
        DoubleType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    from gates.source import _ArrowBuilder

    schema = StructType([
        StructField("id", LongType()), StructField("ship_id", StringType()),
        StructField("weight", DoubleType()), StructField("ts", TimestampType()),
        StructField("n", IntegerType()), StructField("price", DecimalType(10, 2)),
        StructField("tags", ArrayType(StringType())),
        StructField("pos", StructType([StructField("x", DoubleType()),
                                       StructField("at", TimestampType())]))])
    values = [json.dumps({"id": i, "ship_id": f"s{i}", "weight": i / 3, "n": i,
                          "ts": f"2024-03-0{1 + i % 9}T10:11:12.{i:06d}Z",
                          "price": f"{i}.25", "tags": ["a", f"t{i}"] if i % 3 else None,
                          "pos": {"x": 1.5, "at": "2024-01-01T00:00:00+01:00"},
                          "Weight": 99, "extra": {"ignored": True}}).encode()
              for i in range(500)] + [b'{"id": 7}', b"{}"]
    b = _ArrowBuilder(schema, "json")
    fast = b.from_values(values)
    assert b.arrow_json_hits == 1
    slow = b.from_dicts([b.parse(v) for v in values])
    assert fast.schema.equals(b.pa_schema) and fast.equals(slow)
    # A chunk Arrow cannot take (epoch millis, a number in a string column) falls back.
    odd = [b'{"id": 1, "ts": 1704067200000, "ship_id": 5}', b'{"id": 2, "ts": "2024-01-01"}']
    got = b.from_values(odd).to_pylist()
    assert b.arrow_json_hits == 1
    assert [(r["id"], r["ship_id"], r["ts"].timestamp()) for r in got] == \
        [(1, "5", 1704067200.0), (2, None, 1704067200.0)]


# --------------------------------------------------------------------------- (b) gate state

def test_capped_gate_stops_exactly_at_cap(spark, kafka, tmp_path):
    topic = kafka.topic("gate", 3)
    where = kafka.produce(topic, [_record(i) for i in range(90)])  # 30 per partition
    pos = {i: po for i, po in enumerate(where)}
    store, query = tmp_path / "store", f"q-{uuid.uuid4().hex[:6]}"
    assert read_gate(store, query).mode == "open"

    cap = {topic: {0: 10, 1: 0, 2: 25}}
    write_gate(store, query, GateState(mode="capped", cap=cap, epoch=1))
    ck = tmp_path / "ck"
    col = Collector()
    df = _stream(spark, kafka.bootstrap, topic, store=str(store), query=query,
                 maxRecordsPerBatch=7)
    run_available_now(df, ck, col)
    want = sorted(i for i, (p, o) in pos.items() if o < cap[topic][p])
    assert sorted(col.ids) == want and len(want) == 35
    assert is_acked(store, query, cap, epoch=1)
    ack = read_ack(store, query)["topics"][topic]
    assert ack["at_cap"] and ack["mode"] == "capped" and ack["epoch"] == 1
    assert acked_offsets(store, query) == cap

    # Paused: nothing is admitted, the pause is acknowledged at the same offsets.
    write_gate(store, query, GateState(mode="paused", epoch=2))
    col2 = Collector()
    run_available_now(df, ck, col2)
    assert col2.ids == []
    assert read_ack(store, query)["topics"][topic]["mode"] == "paused"

    # Widen the cap, then open: the rest arrives, nothing twice.
    cap2 = {topic: {0: 20, 1: 30, 2: 30}}
    write_gate(store, query, GateState(mode="capped", cap=cap2, epoch=3))
    col3 = Collector()
    run_available_now(df, ck, col3)
    assert sorted(col3.ids) == sorted(i for i, (p, o) in pos.items()
                                      if cap[topic][p] <= o < cap2[topic][p])
    assert is_acked(store, query, cap2, epoch=3)
    write_gate(store, query, GateState(mode="open", epoch=4))
    col4 = Collector()
    run_available_now(df, ck, col4)
    assert sorted(col.ids + col3.ids + col4.ids) == list(range(90))


# --------------------------------------------------------------------------- (c) sink

def _sink_df(spark, ids, tag="x"):
    from pyspark.sql import functions as F

    return spark.createDataFrame([(i, f"s{i}", float(i), tag) for i in ids],
                                 "id BIGINT, ship_id STRING, weight DOUBLE, tag STRING") \
        .withColumn("ts", F.timestamp_micros(F.col("id") * 1_000_001))


def test_sink_exactly_once_skips_replayed_batch(spark, kafka):
    from gates.sink import make_writer

    out = kafka.topic("eos", 2)
    query = f"eos-{uuid.uuid4().hex[:6]}"
    w = make_writer(kafka.bootstrap, out, ["ship_id"], query, "exactly_once")
    w(_sink_df(spark, range(10)), 0)
    w(_sink_df(spark, range(10)), 0)  # same batch again: skipped
    assert w.last_stats["skipped"]
    w(_sink_df(spark, range(10, 15)), 1)
    w.close()
    # A new writer (a restarted query) replays batch 1: skipped too.
    w2 = make_writer(kafka.bootstrap, out, ["ship_id"], query, "exactly_once")
    assert w2.committed_batch() == 1
    w2(_sink_df(spark, range(10, 15), tag="replayed"), 1)
    w2(_sink_df(spark, range(15, 17)), 2)
    w2.close()
    recs = kafka.read_all(out)
    ids = Counter(r.json()["id"] for r in recs)
    assert ids == Counter(range(17))
    assert all(r.json()["tag"] == "x" for r in recs)
    r5 = next(r for r in recs if r.json()["id"] == 5)
    assert r5.key == b'{"ship_id":"s5"}'
    assert r5.json() == {"id": 5, "ship_id": "s5", "weight": 5.0, "tag": "x",
                         "ts": "1970-01-01T00:00:05.000005Z"}


def test_a_stateful_batch_replayed_after_its_output_committed_is_skipped(spark, kafka,
                                                                         tmp_path):
    """A crash after the sink's transaction committed a batch and before Spark's commit log
    recorded it: at restart Spark replays the batch, and the sink skips it without reading
    its DataFrame.  Spark 4's state store commit validation would fail the query there
    (STATE_STORE_COMMIT_VALIDATION_FAILED: the aggregate's state stores never committed in
    the replayed batch); ``Builder.start`` turns it off.  The output stays exact."""
    from compat.infer import analyze
    from compat.serde import from_doc
    from migrate.build import Builder, BuildOptions

    src, out = kafka.topic("replay-in", 2), kafka.topic("replay-out", 2)
    rows = [{"k": f"k{i % 4}", "x": i} for i in range(40)]
    kafka.produce(src, [json.dumps(r) for r in rows])
    doc = {"format": "theseus.plan/1", "query": f"replay_{uuid.uuid4().hex[:6]}",
           "config": {"state_partitions": 2}, "nodes": [
               {"id": "s", "step": "source", "version": 1, "topic": src, "partitions": 2,
                "format": "json", "role": "stream",
                "schema": [{"name": "k", "type": "string"},
                                             {"name": "x", "type": "bigint"}]},
               {"id": "a", "step": "aggregate", "version": 1, "inputs": ["s"],
                "group_by": [{"name": "k", "expr": "k"}],
                "aggregates": [{"name": "total", "function": "sum", "args": ["x"]}]},
               {"id": "out", "step": "sink", "version": 1, "inputs": ["a"], "topic": out,
                "format": "json", "key_columns": ["k"], "mode": "update",
                "delivery": "exactly_once"}]}
    ck = tmp_path / "ck"

    def run():
        plan = from_doc(doc)
        analyze(plan)
        q = Builder(spark, plan, BuildOptions(bootstrap=kafka.bootstrap, query=plan.query,
                                              available_now=True, checkpoint=str(ck),
                                              max_records_per_batch=10)).start()
        q.awaitTermination(240)
        assert q.exception() is None, str(q.exception())
        return q

    first = run()
    last = max(p["batchId"] for p in first.recentProgress)
    assert last >= 2, "the run should take several batches"
    written = len(kafka.read_all(out))
    # the crash: the sink committed the batch, Spark's commit log did not record it
    for name in (str(last), f".{last}.crc"):
        (ck / "commits" / name).unlink(missing_ok=True)
    again = run()
    assert last in {p["batchId"] for p in again.recentProgress}, "no batch was replayed"
    recs = kafka.read_all(out)
    assert len(recs) == written, "the replayed batch was written twice"
    final = {r.json()["k"]: r.json()["total"] for r in recs}
    assert final == {f"k{j}": sum(i for i in range(40) if i % 4 == j) for j in range(4)}


def test_sink_at_least_once_tombstones_and_start_gate(spark, kafka):
    from pyspark.sql import functions as F

    from gates.sink import make_writer

    out = kafka.topic("alo", 1)
    shadow = kafka.topic("alo-shadow", 1)
    gate = {"open": False}
    w = make_writer(kafka.bootstrap, out, ["ship_id"], f"alo-{uuid.uuid4().hex[:6]}",
                    "at_least_once", start_gate=lambda batch_id: gate["open"],
                    shadow_topic=shadow)
    df = _sink_df(spark, range(4)).withColumn(
        "_theseus_op", F.when(F.col("id") == 2, F.lit("D")).otherwise(F.lit("U")))
    w(df, 0)  # gate closed: goes to the shadow topic
    gate["open"] = True
    w(df, 1)
    w.close()
    for t in (out, shadow):
        recs = kafka.read_all(t)
        assert [r.key_json() for r in recs] == [{"ship_id": f"s{i}"} for i in range(4)]
        assert [r.value is None for r in recs] == [False, False, True, False]
        assert all("_theseus_op" not in r.json() for r in recs if r.value is not None)


def test_sink_no_key_columns_and_discarding_gate(spark, kafka):
    from gates.sink import make_writer

    out = kafka.topic("nokey", 1)
    query = f"nk-{uuid.uuid4().hex[:6]}"
    w = make_writer(kafka.bootstrap, out, [], query, "exactly_once",
                    start_gate=lambda b: b >= 1)
    w(_sink_df(spark, range(3)), 0)  # discarded, but its batch id is committed
    w(_sink_df(spark, range(3, 5)), 1)
    w.close()
    recs = kafka.read_all(out)
    assert [r.key for r in recs] == [None, None]
    assert [r.json()["id"] for r in recs] == [3, 4]
    w2 = make_writer(kafka.bootstrap, out, [], query, "exactly_once")  # gate now open
    w2(_sink_df(spark, range(3)), 0)  # replay of the discarded batch: still skipped
    w2.close()
    assert len(kafka.read_all(out)) == 2


def test_sink_throughput_counts_every_row(spark, kafka, record_property, capsys):
    """Not a timed test: writes a cached batch four times per delivery, as the sink bench
    does, reports rows/s and checks every row landed once.  The 200k-row figure is
    ``make bench-sink`` (bench/sink_speed.py); 20k rows still spread over both Spark
    partitions and all three topic partitions, with eight batches and their transactions."""
    from pyspark.sql import functions as F

    from gates.sink import make_writer

    rows = 20_000
    out = kafka.topic("tput", 3)
    df = spark.range(rows).select(
        F.col("id"), F.concat(F.lit("ship-"), (F.col("id") % 1000).cast("string")).alias("ship_id"),
        (F.col("id") * 0.25).alias("weight"), F.timestamp_seconds(F.col("id")).alias("ts")).cache()
    df.count()
    figures = {}
    for delivery in ("exactly_once", "at_least_once"):
        w = make_writer(kafka.bootstrap, out, ["ship_id"], f"tp-{uuid.uuid4().hex[:6]}",
                        delivery)
        w(df, 0)  # warm up: producer, transactions, JVM code paths
        best = None
        for bid in (1, 2, 3):
            t0 = time.perf_counter()
            w(df, bid)
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
        w.close()
        figures[delivery] = round(rows / best)
        record_property(f"sink_rows_per_s_{delivery}", figures[delivery])
    df.unpersist()
    ends = kafka.end_offsets(out)
    assert all(ends.values()), f"a partition got nothing: {ends}"
    # 8 batches of every row, plus one commit marker per partition per exactly-once batch.
    assert 8 * rows <= sum(ends.values()) <= 8 * rows + 4 * 3
    with capsys.disabled():
        print(f"\n[sink throughput, {rows}-row batch] {figures}")


def _wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.2)


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.own_jvm
def test_sink_exactly_once_survives_sigkill(kafka, tmp_path):
    """SIGKILL a running query twice (inside a transaction; after a commit but before Spark
    records the batch), restart it on the same checkpoint: no duplicate, no gap."""
    if jvm_running():
        pytest.skip("a Spark JVM already runs in this process; run this test on its own "
                    "(it is ordered first in a full run)")
    src, out = kafka.topic("kill-in", 3), kafka.topic("kill-out", 2)
    kafka.produce(src, [{"id": i, "payload": f"p{i}"} for i in range(3000)])
    ck, sig = tmp_path / "ck", tmp_path / "signals"
    sig.mkdir()
    query = f"kill-{uuid.uuid4().hex[:6]}"
    job = [PYTHON, str(Path(__file__).with_name("sink_kill_job.py")),
           "--bootstrap", kafka.bootstrap, "--input", src, "--output", out,
           "--checkpoint", str(ck), "--query", query, "--signal-dir", str(sig)]
    logs = []

    def run(extra, kill_on=None, timeout=300):
        log = tmp_path / f"job{len(logs)}.log"
        logs.append(log)
        with open(log, "w") as f:
            p = subprocess.Popen(job + extra, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                                 env=spark_env(), start_new_session=True)
        try:
            if kill_on is None:
                rc = p.wait(timeout)
                assert rc == 0, f"job failed ({rc}):\n{log.read_text()[-4000:]}"
                return
            _wait_for(lambda: any(sig.glob(f"{kill_on}-*")) or p.poll() is not None,
                      timeout, f"the job to reach {kill_on}")
            assert p.poll() is None, f"job ended early:\n{log.read_text()[-4000:]}"
            time.sleep(0.5)
            os.killpg(p.pid, signal.SIGKILL)  # the whole driver: Python and its JVM
            p.wait(30)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(30)
            _wait_for(lambda: _group_gone(p.pid), 60, "the killed job's JVM to exit")

    # 1. Killed with batch >= 2's transaction open.
    run(["--hold", "in_txn", "--hold-from", "2"], kill_on="in_txn")
    first = [r.json()["id"] for r in kafka.read_all(out)]
    assert len(first) == len(set(first)) and len(first) % 400 == 0 and len(first) >= 800
    # 2. Restarted, killed right after batch >= 4 committed its transaction (Spark has not
    #    recorded the batch as done, so the next run replays it).
    run(["--hold", "after_commit", "--hold-from", "4"], kill_on="after_commit")
    # More input arrives while the query is down.
    kafka.produce(src, [{"id": i, "payload": f"p{i}"} for i in range(3000, 3600)])
    # 3. Restarted to the end.
    run([])
    log3 = logs[-1].read_text()
    assert "already committed" in log3, "the replayed batch should have been skipped"
    recs = kafka.read_all(out)
    ids = Counter(r.json()["id"] for r in recs)
    dups = {i: n for i, n in ids.items() if n > 1}
    assert not dups, f"duplicates: {list(dups.items())[:10]}"
    assert set(ids) == set(range(3600)), f"missing: {sorted(set(range(3600)) - set(ids))[:10]}"
    assert all(r.json()["payload"] == f"P{r.json()['id']}" for r in recs)


# --------------------------------------------------------------------------- (d) table role

def _table(spark, bootstrap, topic):
    return (spark.read.format("theseus_kafka").option("bootstrap", bootstrap)
            .option("topic", topic).option("partitions", 2).option("role", "table")
            .option("key_columns", "ship_id").option("schema", "ship_id STRING, cap DOUBLE")
            .load())


def test_table_role_latest_value_per_key(spark, kafka):
    topic = kafka.topic("tbl", 2)
    ks = lambda s: {"ship_id": s}  # noqa: E731
    kafka.produce(topic, [{"ship_id": "a", "cap": 1.0}, {"ship_id": "b", "cap": 2.0},
                          {"ship_id": "c", "cap": 3.0}, {"ship_id": "a", "cap": 1.5},
                          None, {"cap": 4.0}],
                  keys=[ks("a"), ks("b"), ks("c"), ks("a"), ks("b"), ks("d")])
    write_control_events(kafka.bootstrap, [topic], "mig-t")
    df = _table(spark, kafka.bootstrap, topic)
    assert {r.ship_id: r.cap for r in df.collect()} == {"a": 1.5, "c": 3.0, "d": 4.0}
    kafka.produce(topic, [{"ship_id": "b", "cap": 9.0}, None], keys=[ks("b"), ks("c")])
    # The same DataFrame read again sees the table as it is now.
    assert {r.ship_id: r.cap for r in df.collect()} == {"a": 1.5, "b": 9.0, "d": 4.0}


def test_table_role_refreshes_in_stream_static_join(spark, kafka, tmp_path):
    """A stream-static join re-reads the table every micro-batch."""
    events, table = kafka.topic("ev", 3), kafka.topic("caps", 2)
    kafka.produce(table, [{"ship_id": "s1", "cap": 1.0}], keys=[{"ship_id": "s1"}])
    kafka.produce(events, [{"id": i, "ship_id": "s1", "weight": 1.0, "ts": T0_MS}
                           for i in range(6)], partition=0)
    joined = _stream(spark, kafka.bootstrap, events, maxRecordsPerBatch=3) \
        .join(_table(spark, kafka.bootstrap, table), "ship_id")
    seen = []

    def fb(df, batch_id):
        seen.append(sorted((r.id, r.cap) for r in df.collect()))
        if batch_id == 0:  # update the table between batches (runs on the driver)
            kafka.produce(table, [{"ship_id": "s1", "cap": 2.0}], keys=[{"ship_id": "s1"}])

    run_available_now(joined, tmp_path / "ck", fb)
    assert [s for s in seen if s] == [[(0, 1.0), (1, 1.0), (2, 1.0)],
                                     [(3, 2.0), (4, 2.0), (5, 2.0)]]
