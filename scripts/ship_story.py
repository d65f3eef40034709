"""The ship-load story on real Kafka and Spark, shared by `make demo` and the migration bench.

v1 (the fixture plan) runs under `theseus run` in its own process while packages keep
arriving at a steady rate; `theseus migrate start` applies v1b (the capacity rule 90% ->
80%: the checker says in_place, a graceful restart on the same checkpoint), then v2 (the
aggregate also counts packages: the state is incompatible, a live shadow migration that
recomputes the history).  Afterwards an oracle reads the output topic:

* per ship, the rows switch once from the old shape to the new one (never back);
* every ship touched from the cut on ends with the new plan applied to ALL input
  (load, capacity and package count recomputed from offset 0; a tombstone when under
  the 80% rule), so nothing was lost or counted twice.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SHIPS = {f"s{i:02d}": 400.0 + 150.0 * (i % 7) for i in range(12)}
THESEUS = [sys.executable, "-m", "migrate.cli"]


def bootstrap() -> str:
    if os.environ.get("KAFKA_BOOTSTRAP"):
        return os.environ["KAFKA_BOOTSTRAP"]
    out = subprocess.run(["bash", str(ROOT / "scripts" / "kafka.sh"), "start"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.stderr.write(out.stderr)
        raise SystemExit("could not start Kafka")
    return out.stdout.strip().splitlines()[-1].split("=", 1)[1]


def plans(topics: dict[str, str]) -> dict[str, dict]:
    """v1 (fixture), v1b (capacity rule at 80%), v2 (v1b + a package count)."""
    base = json.loads((ROOT / "fixtures" / "plans" / "ship_load.json").read_text())
    for n in base["nodes"]:
        if "topic" in n:
            n["topic"] = topics[n["topic"]]
    out = {}
    for name, pred, count in (("v1", "load > capacity * 0.9", False),
                              ("v1b", "load > capacity * 0.8", False),
                              ("v2", "load > capacity * 0.8", True)):
        doc = json.loads(json.dumps(base))
        for n in doc["nodes"]:
            if n["id"] == "over_capacity":
                n["predicate"] = pred
            if n["id"] == "load" and count:
                n["aggregates"].append({"name": "packages", "function": "count",
                                        "args": ["*"]})
        out[name] = doc
    return out


class Feeder(threading.Thread):
    """Packages for the ships at a steady rate (records per second) until stopped."""

    def __init__(self, bs: str, topic: str, rate: int, start_n: int = 0) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Producer

        self.p = Producer({"bootstrap.servers": bs, "enable.idempotence": True,
                           "linger.ms": 5})
        self.topic, self.rate, self.n = topic, rate, start_n
        self.halt = threading.Event()

    def record(self, i: int) -> tuple[str, str]:
        ship = f"s{i % len(SHIPS):02d}"
        ts = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return (json.dumps({"ship_id": ship}),
                json.dumps({"ship_id": ship, "weight": float(i % 9 + 1), "ts": ts}))

    def run(self) -> None:
        tick = 0.1
        per_tick = max(1, int(self.rate * tick))
        nxt = time.monotonic()
        while not self.halt.is_set():
            for _ in range(per_tick):
                k, v = self.record(self.n)
                self.p.produce(self.topic, v, k)
                self.n += 1
            self.p.poll(0)
            nxt += tick
            time.sleep(max(0.0, nxt - time.monotonic()))
        self.p.flush(30)

    def stop(self) -> None:
        self.halt.set()
        self.join(60)


@dataclass
class Story:
    bs: str
    work: Path
    rate: int = 50
    trigger: str = "1 second"
    history: int = 0  # packages produced before v1 starts (a backlog to backfill)
    echo: object = print
    topics: dict[str, str] = field(default_factory=dict)
    paths: dict[str, Path] = field(default_factory=dict)
    procs: list = field(default_factory=list)

    def __post_init__(self) -> None:
        tag = f"{time.strftime('%H%M%S')}{os.getpid() % 1000:03d}"
        self.topics = {t: f"story{tag}-{t}" for t in ("packages", "ships", "ship_alerts")}
        self.state = self.work / "state"
        self.work.mkdir(parents=True, exist_ok=True)
        for name, doc in plans(self.topics).items():
            p = self.work / f"ship_load_{name}.json"
            p.write_text(json.dumps(doc, indent=2) + "\n")
            self.paths[name] = p

    # -- Kafka --------------------------------------------------------------------------
    def create_topics(self) -> None:
        from confluent_kafka import Producer
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bs})
        futs = admin.create_topics([NewTopic(self.topics["packages"], 3, 1),
                                    NewTopic(self.topics["ships"], 1, 1),
                                    NewTopic(self.topics["ship_alerts"], 3, 1)])
        for f in futs.values():
            f.result(30)
        p = Producer({"bootstrap.servers": self.bs})
        for ship, cap in SHIPS.items():
            p.produce(self.topics["ships"], json.dumps({"ship_id": ship, "capacity": cap}),
                      json.dumps({"ship_id": ship}))
        if self.history:
            f = Feeder(self.bs, self.topics["packages"], 1)
            for i in range(self.history):
                k, v = f.record(i)
                while True:
                    try:
                        p.produce(self.topics["packages"], v, k)
                        break
                    except BufferError:
                        p.poll(0.05)
        p.flush(60)

    def read(self, topic: str) -> list:
        """Every committed record of a topic: (partition, offset, timestamp_ms, key, value)."""
        from confluent_kafka import Consumer, KafkaError, TopicPartition

        c = Consumer({"bootstrap.servers": self.bs, "group.id": f"story-{time.time_ns()}",
                      "isolation.level": "read_committed", "enable.auto.commit": False,
                      "enable.partition.eof": True})
        meta = c.list_topics(topic, timeout=30).topics[topic]
        todo = set()
        assign = []
        for p in sorted(meta.partitions):
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            if hi > lo:
                todo.add(p)
                assign.append(TopicPartition(topic, p, lo))
        c.assign(assign)
        out = []
        deadline = time.monotonic() + 120
        while todo and time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    todo.discard(m.partition())
                continue
            if "theseus.control" in dict(m.headers() or []):
                continue
            out.append((m.partition(), m.offset(), m.timestamp()[1],
                        m.key().decode() if m.key() else None,
                        json.loads(m.value()) if m.value() else None))
        c.close()
        return out

    # -- theseus ------------------------------------------------------------------------
    def theseus(self, *args: str, show: bool = True) -> subprocess.CompletedProcess:
        if not show:
            return subprocess.run(THESEUS + list(args), cwd=ROOT, capture_output=True,
                                  text=True)
        self.echo("$ theseus " + " ".join(args))
        proc = subprocess.Popen(THESEUS + list(args), cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        lines = []
        for line in proc.stdout:  # live progress
            lines.append(line)
            self.echo("  " + line.rstrip("\n"))
        proc.wait()
        return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(lines), "")

    def start_v1(self) -> None:
        log = open(self.work / "v1.log", "ab")
        self.echo(f"$ theseus run {self.paths['v1']} --bootstrap {self.bs} --state "
                  f"{self.state}   (in the background)")
        self.procs.append(subprocess.Popen(
            THESEUS + ["run", str(self.paths["v1"]), "--bootstrap", self.bs, "--state",
                       str(self.state), "--trigger", self.trigger],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT))

    def wait_running(self, instance: str, timeout: float = 180) -> None:
        from migrate.store import DirectoryStore

        store = DirectoryStore(self.state)
        deadline = time.monotonic() + timeout
        while store.status(instance).get("status") != "running":
            if time.monotonic() > deadline:
                raise SystemExit(f"'{instance}' did not start; see {self.work}")
            time.sleep(0.5)

    def drain_and_stop(self, query: str, timeout: float = 240) -> None:
        """Wait until the live instance has processed every input record, then stop it."""
        from gates.state import is_acked
        from migrate.store import DirectoryStore

        store = DirectoryStore(self.state)
        inst = store.live_instance(query)
        high = {self.topics["packages"]: self.end_offsets(self.topics["packages"])}
        deadline = time.monotonic() + timeout
        while not is_acked(self.state, inst, high):
            if time.monotonic() > deadline:
                raise SystemExit(f"'{inst}' did not drain its input; see {self.work}")
            time.sleep(0.5)
        self.theseus("stop", query, "--state", str(self.state), show=False)
        while store.status(inst).get("status") not in ("stopped", "failed"):
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        for p in self.procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()

    def cleanup(self, timeout: float = 30) -> None:
        """Stop every query instance this story started, even after a failure: ask each to
        stop between batches, then terminate what is still running."""
        import signal

        from migrate.store import DirectoryStore

        qdir = self.state / "queries"
        if not qdir.exists():
            return
        store = DirectoryStore(self.state)
        names = [d.name for d in qdir.iterdir() if d.is_dir()]
        for n in names:
            store.request_stop(n)
        deadline = time.monotonic() + timeout
        for n in names:
            pid = store.status(n).get("pid")
            while pid and time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except OSError:
                    break
                time.sleep(0.5)
            else:
                if pid:
                    try:
                        os.kill(pid, signal.SIGTERM)
                    except OSError:
                        pass
        for p in self.procs:
            if p.poll() is None:
                p.kill()

    def end_offsets(self, topic: str) -> dict[int, int]:
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer({"bootstrap.servers": self.bs, "group.id": "story-offsets"})
        parts = c.list_topics(topic, timeout=30).topics[topic].partitions
        out = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
               for p in sorted(parts)}
        c.close()
        return out

    # -- the oracle ---------------------------------------------------------------------
    def oracle(self, cut: dict[str, int]) -> dict:
        """Check the output against the plans; returns figures and a list of problems."""
        inputs = self.read(self.topics["packages"])
        rows = self.read(self.topics["ship_alerts"])
        problems: list[str] = []
        after = {json.loads(k)["ship_id"] for p, o, _, k, v in inputs
                 if o >= cut[str(p)]}
        total: dict[str, tuple[float, int]] = {}
        for *_, v in inputs:
            s, c = total.get(v["ship_id"], (0.0, 0))
            total[v["ship_id"]] = (s + v["weight"], c + 1)
        per_key: dict[str, list] = {}
        for _p, _o, ts, k, v in sorted(rows, key=lambda r: (r[0], r[1])):
            per_key.setdefault(json.loads(k)["ship_id"], []).append((ts, v))
        switched = 0
        for ship, seq in per_key.items():
            kinds = [("new" if "packages" in v else "old") for _, v in seq if v is not None]
            if kinds != sorted(kinds, key=lambda x: x == "new"):
                problems.append(f"{ship}: an old-plan row after a new-plan row")
            switched += "new" in kinds
        for ship in sorted(after):
            load, count = total[ship]
            cap = SHIPS[ship]
            want = ({"ship_id": ship, "load": load, "capacity": cap, "packages": count}
                    if load > cap * 0.8 else None)
            seq = per_key.get(ship, [])
            got = seq[-1][1] if seq else None
            if got != want:
                problems.append(f"{ship}: final row {got}, the new plan over all input "
                                f"says {want}")
        olds = [ts for _, _, ts, _, v in rows if v is not None and "packages" not in v]
        news = [ts for _, _, ts, _, v in rows if v is not None and "packages" in v]
        return {"input_records": len(inputs), "output_records": len(rows),
                "ships_touched_after_cut": len(after), "ships_switched": switched,
                "old_last_ms": max(olds) if olds else None,
                "new_first_ms": min(news) if news else None, "problems": problems}


def migration_record(state: Path, query: str) -> dict:
    from dataclasses import asdict

    from migrate import migration
    from migrate.store import DirectoryStore

    return asdict(migration.current(DirectoryStore(state), query))
