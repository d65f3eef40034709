"""Benchmark part of ``make bench-migrate``: the stall at the cutover with and without
reconciliation, for an aggregate over many keys (``BENCH_RECONCILE_KEYS``, 100000).

The old plan sums per key; the new one adds a count (a shadow migration). Every key gets one
record of history; during the migration a feeder writes ``BENCH_RATE`` records/s to 100 hot
keys.  The output has one partition, so its records are in write order:

* **stall** — from the old query's last row to the first row of the new query's first batch
  from C (Kafka timestamps).  With reconciliation, that batch's transaction starts with the
  corrections (their number is in the migration record), so its first *batch* row is the
  one after them: the stall includes reading both topics and writing every correction.
* **oracle** — with reconciliation, the compacted output equals the new plan over all input
  for every key; without, the keys untouched after the cut keep the old plan's value
  (counted as ``stale_keys``: the gap reconciliation closes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
THESEUS = [sys.executable, "-m", "migrate.cli"]
KEYS = int(os.environ.get("BENCH_RECONCILE_KEYS", "100000"))
RATE = int(os.environ.get("BENCH_RATE", "200"))
HOT = 100


def plan(query: str, src: str, out: str, new: bool) -> dict:
    aggs = [{"name": "s", "function": "sum", "args": ["x"]}]
    if new:
        aggs.append({"name": "c", "function": "count", "args": ["*"]})
    return {"format": "theseus.plan/1", "query": query, "config": {"state_partitions": 2},
            "nodes": [
                {"id": "events", "step": "source", "version": 1, "topic": src,
                 "partitions": 3, "format": "json", "role": "stream",
                 "schema": [{"name": "k", "type": "string"}, {"name": "x", "type": "bigint"}]},
                {"id": "per_key", "step": "aggregate", "version": 1, "inputs": ["events"],
                 "group_by": [{"name": "k", "expr": "k"}], "aggregates": aggs},
                {"id": "out", "step": "sink", "version": 1, "inputs": ["per_key"],
                 "topic": out, "format": "json", "key_columns": ["k"], "mode": "update",
                 "delivery": "exactly_once"}]}


class Feeder(threading.Thread):
    def __init__(self, bs: str, topic: str) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Producer

        self.p = Producer({"bootstrap.servers": bs, "enable.idempotence": True})
        self.topic, self.n, self.halt = topic, 0, threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            for _ in range(max(1, RATE // 10)):
                k = f"k{self.n % HOT:06d}"
                self.p.produce(self.topic, json.dumps({"k": k, "x": 1}), key=k)
                self.n += 1
            self.p.poll(0)
            time.sleep(0.1)
        self.p.flush(30)


def topics(bs: str, tag: str) -> tuple[str, str]:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bs})
    src, out = f"bench-rec-in-{tag}", f"bench-rec-out-{tag}"
    fs = admin.create_topics([NewTopic(src, 3, 1),
                              NewTopic(out, 1, 1, config={"cleanup.policy": "compact"})])
    for f in fs.values():
        f.result(30)
    return src, out


def history(bs: str, src: str) -> None:
    from confluent_kafka import Producer

    from bench.feed import put

    p = Producer({"bootstrap.servers": bs, "linger.ms": 50, "enable.idempotence": True})
    for i in range(KEYS):
        k = f"k{i:06d}"
        put(p, src, json.dumps({"k": k, "x": 1}), key=k)
    p.flush(120)


def read(bs: str, topic: str) -> list[tuple[int, int, bytes, bytes | None, list | None]]:
    """(offset, timestamp ms, key, value, headers) of every committed record, in order
    within each partition."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": bs, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                  "isolation.level": "read_committed", "enable.auto.commit": False,
                  "enable.partition.eof": True})
    out = []
    try:
        for p in sorted(c.list_topics(topic, timeout=30).topics[topic].partitions):
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            if hi <= lo:
                continue
            c.assign([TopicPartition(topic, p, lo)])
            deadline = time.monotonic() + 300
            done = False
            while not done:
                if time.monotonic() > deadline:
                    raise SystemExit(f"cannot read {topic}[{p}] to {hi}")
                for m in c.consume(10000, timeout=1.0):
                    if m.error():
                        if m.error().code() == KafkaError._PARTITION_EOF and \
                                m.offset() >= hi:
                            done = True
                        continue
                    if m.offset() < hi:
                        out.append((m.offset(), m.timestamp()[1], m.key(), m.value(),
                                    m.headers()))
                    if m.offset() >= hi - 1:
                        done = True
    finally:
        c.close()
    return out


def wait(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out: {what}")
        time.sleep(1)


def run_one(bs: str, work: Path, reconcile: bool) -> dict:
    from gates.broker import watermarks
    from gates.control import is_control
    from gates.state import is_acked
    from migrate import migration
    from migrate.store import DirectoryStore

    tag = uuid.uuid4().hex[:8]
    src, out = topics(bs, tag)
    state = work / "state"
    state.mkdir(parents=True, exist_ok=True)
    query = f"rec_{tag}"
    old_p, new_p = work / "v1.json", work / "v2.json"
    old_p.write_text(json.dumps(plan(query, src, out, False)))
    new_p.write_text(json.dumps(plan(query, src, out, True)))
    history(bs, src)
    log = open(work / "old.log", "ab")
    old = subprocess.Popen(THESEUS + ["run", str(old_p), "--bootstrap", bs, "--state",
                                      str(state)], cwd=ROOT, stdout=log,
                           stderr=subprocess.STDOUT)
    store = DirectoryStore(state)
    feeder = Feeder(bs, src)
    try:
        high = watermarks(bs, [src])
        wait(lambda: is_acked(state, query, high), 900, "v1 processes the history")
        feeder.start()
        time.sleep(5)
        t0 = time.time()
        r = subprocess.run(THESEUS + ["migrate", "start", str(new_p), "--bootstrap", bs,
                                      "--state", str(state), "--timeout", "1500",
                                      "--reconcile", "on" if reconcile else "off"],
                           cwd=ROOT, capture_output=True, text=True,
                           env=dict(os.environ, THESEUS_PLAIN_PROGRESS="1"))
        took = time.time() - t0
        if r.returncode != 0:
            subprocess.run(THESEUS + ["migrate", "abort", query, "--state", str(state)],
                           cwd=ROOT, capture_output=True)  # stops the shadow
            old.terminate()
            raise SystemExit("migration failed:\n" + r.stdout + r.stderr)
        time.sleep(5)
    except BaseException:
        if old.poll() is None:
            old.terminate()
        raise
    finally:
        feeder.halt.set()
        feeder.join(60)
    inst = store.live_instance(query)
    end = watermarks(bs, [src])
    wait(lambda: is_acked(state, inst, end), 600, "the new query drains the input")
    subprocess.run(THESEUS + ["stop", query, "--state", str(state)], cwd=ROOT,
                   capture_output=True)
    wait(lambda: store.status(inst).get("status") == "stopped", 300, "the new query stops")
    old.wait(60)
    m = migration.current(store, query)
    rows = [r for r in read(bs, out) if not is_control(r[4])]
    first_new = next(i for i, r in enumerate(rows) if r[3] is None or b'"c"' in r[3])
    old_last_ms = max(r[1] for r in rows[:first_new])
    counts = m.counts
    ncorr = sum(counts.get(k, 0) for k in ("corrected", "added", "deleted"))
    batch_first = rows[first_new + ncorr] if len(rows) > first_new + ncorr else None
    stall_s = ((batch_first[1] if batch_first else rows[first_new][1]) - old_last_ms) / 1000
    # the oracle: the new plan over all input, per key
    want: dict = {}
    for _o, _ts, _k, v, h in read(bs, src):
        if v is None or is_control(h):
            continue
        d = json.loads(v)
        s, c = want.get(d["k"], (0, 0))
        want[d["k"]] = (s + d["x"], c + 1)
    view: dict = {}
    for _o, _ts, k, v, _h in rows:
        view[json.loads(k)["k"]] = None if v is None else json.loads(v)
    wrong = [k for k, (s, c) in want.items()
             if not (view.get(k) and view[k].get("s") == s and view[k].get("c") == c)]
    from gates.reconcile import read_record

    rec = read_record(state, m.new_instance)
    parts = {}
    if rec:
        parts = {"hand_over_read_and_diff_seconds": counts.get("seconds"),
                 "hand_over_write_and_commit_seconds": round(
                     rec["committed_at"] - rec["at"], 3)}
    return {"reconcile": reconcile, "keys": KEYS, "input_rate_per_s": RATE, **parts,
            "migration_seconds": round(took, 1),
            "stall_seconds": round(stall_s, 2),
            "counts": counts,
            "keys_not_the_new_plan_over_all_input": len(wrong),
            "corrections_written": ncorr}


def reconcile_part(bs: str) -> dict:
    res = {}
    for rec in (False, True):
        work = ROOT / ".cache" / "bench" / f"reconcile-{time.strftime('%H%M%S')}-{int(rec)}"
        res["with" if rec else "without"] = run_one(bs, work, rec)
        print(json.dumps(res["with" if rec else "without"], indent=2), flush=True)
    res["stall_added_seconds"] = round(res["with"]["stall_seconds"]
                                       - res["without"]["stall_seconds"], 2)
    res["target"] = "reconciliation adds at most one trigger interval (1 s) to the stall"
    return res


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    from migrate.run import spark_env
    from scripts.ship_story import bootstrap

    spark_env()
    print(json.dumps(reconcile_part(bootstrap()), indent=2))
