"""The store on a compacted Kafka topic (``--state kafka://HOST:PORT/TOPIC``), for hosts that
share nothing but the broker.

Every process that opens the store keeps a local mirror directory with exactly the layout of
``migrate.store.DirectoryStore`` (so the gated source and sink, which read and write plain
files, work unchanged) and a sync thread that

* consumes the topic (key = the file's path under the store root, value = its text, a
  tombstone for a deleted file) and writes what other processes published into the mirror;
* scans the mirror and publishes what changed locally (new or changed files, deletions).

Each record carries the file's modification time (ns) and the publishing process; a record
is applied only when it is newer than the local file, so a stale copy never overwrites a
newer write (each key has one writer at a time in the protocol: the migrator writes plans,
gates, stop requests and migration records; a query host writes its status and acks).
``flush()`` publishes pending local changes and waits for the broker: the migrator calls it
after recording a phase, so every phase transition is in Kafka before it acts. Opening the
store blocks until the mirror has caught up with the topic.

Checkpoints and logs stay local (``checkpoints/``, ``logs/``): a Spark checkpoint belongs to the
host that runs the query instance. The mirror lives under ``$THESEUS_LOCAL_DIR`` (default
``.theseus/``) in ``kafka-<host>_<port>-<topic>/``.

Leases (``leases/<query>.json``, :mod:`gates.lease`) are the one exception to "newer wins":
the scan never publishes them; their owner does, each write in a Kafka transaction of a
producer whose ``transactional.id`` names the store topic and the query
(:meth:`KafkaMirror.lease_fence`, :meth:`KafkaMirror.lease_publish`).  A new owner's
``init_transactions`` bumps that producer's epoch at the broker, so the previous owner's next
write of the lease fails (Kafka's zombie fencing) and it stops; readers (``read_committed``)
apply a lease record only when its ``(epoch, seq)`` is above the one they have, whatever the
order its copies arrive in.

``migrate.store`` imports this module, never the other way round; both write files through
:func:`gates.files.atomic_write`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
import uuid
from pathlib import Path

from compat.errors import DeadlineExceeded, RuntimeFailure
from gates.broker import client_conf
from gates.deadline import Deadline
from gates.files import atomic_write
from gates.retry import retry

LEASES = "leases/"
_HOSTPORT = r"[A-Za-z0-9_.\-\[\]:]+:\d+"
# several brokers, comma-separated: the store still opens while one of them is down
_SPEC = re.compile(rf"^kafka://(?P<bootstrap>{_HOSTPORT}(?:,{_HOSTPORT})*)/(?P<topic>[A-Za-z0-9._\-]+)$")
LOCAL_ONLY = ("checkpoints", "logs")


def parse_spec(spec: str) -> tuple[str, str]:
    """``kafka://host:port[,host:port...]/topic`` -> (bootstrap, topic), or a clear error."""
    m = _SPEC.match(spec)
    if not m:
        raise RuntimeFailure("malformed Kafka store address", file=spec,
                             expected="kafka://HOST:PORT[,HOST:PORT...]/TOPIC", found=spec)
    return m["bootstrap"], m["topic"]


def local_dir(spec: str) -> Path:
    bootstrap, topic = parse_spec(spec)
    base = Path(os.environ.get("THESEUS_LOCAL_DIR", ".theseus"))
    return base / f"kafka-{bootstrap.replace(':', '_').replace(',', '+')}-{topic}"


def _digest(text: str | None) -> str | None:
    return None if text is None else hashlib.sha1(text.encode()).hexdigest()


class KafkaMirror:
    """Keeps ``root`` and the compacted topic in step, in a background thread."""

    def __init__(self, spec: str, root: Path, interval: float = 0.1,
                 timeout: float = 60.0) -> None:
        # librdkafka loads with the first call that reaches a broker (start-up time)
        from confluent_kafka import Consumer, Producer, TopicPartition

        self.spec = spec
        self.bootstrap, self.topic = parse_spec(spec)
        self.root = root
        self.interval = interval
        self.origin = uuid.uuid4().hex  # records this mirror published come back: skip them
        self.known: dict[str, str | None] = {}  # key -> digest of what root holds for it
        self.lock = threading.RLock()
        self.consumed = 0  # the next offset of the topic to apply (read_committed)
        self.leasers: dict[str, object] = {}  # query -> its lease's transactional producer
        self._ensure_topic(timeout)
        self.producer = Producer(client_conf(self.bootstrap, **{
            "enable.idempotence": True, "acks": "all", "linger.ms": 0}))
        self.consumer = Consumer(client_conf(self.bootstrap, **{
            "group.id": f"theseus-store-{self.origin}", "enable.auto.commit": False,
            "enable.partition.eof": True}))
        self.consumer.assign([TopicPartition(self.topic, 0, 0)])
        self._catch_up(timeout)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="theseus-store-sync",
                                       daemon=True)
        self.thread.start()

    # -- setup ----------------------------------------------------------------------------
    def _ensure_topic(self, timeout: float) -> None:
        # librdkafka loads with the first call that reaches a broker (start-up time)
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient(client_conf(self.bootstrap))
        try:
            topics = admin.list_topics(timeout=timeout).topics
        except Exception as e:
            raise RuntimeFailure(f"the Kafka store's broker does not answer: {e}",
                                 file=self.spec, expected="a reachable broker",
                                 found=self.bootstrap) from None
        if self.topic in topics:
            return
        # Replication factor -1: the cluster's default.replication.factor (3 on the
        # three-broker cluster, with its min.insync.replicas), never a fixed 1.
        fut = admin.create_topics([NewTopic(self.topic, 1, -1, config={
            "cleanup.policy": "compact", "min.compaction.lag.ms": "0",
            "segment.ms": "600000"})])[self.topic]
        try:
            fut.result(timeout)
        except Exception as e:
            if "TOPIC_ALREADY_EXISTS" not in str(e):
                raise RuntimeFailure(f"cannot create the store topic: {e}",
                                     file=self.spec) from None

    def _catch_up(self, timeout: float) -> None:
        # librdkafka loads with the first call that reaches a broker (start-up time)
        from confluent_kafka import KafkaException, TopicPartition

        deadline = Deadline(timeout)
        tp = TopicPartition(self.topic, 0)
        try:
            # the store topic's leader may have just died: wait for the next one
            _, hi = retry(lambda t: self.consumer.get_watermark_offsets(tp, timeout=t),
                          deadline, "the Kafka store's topic", cap=10.0)
        except (KafkaException, DeadlineExceeded) as e:
            raise RuntimeFailure(f"the Kafka store's topic cannot be read: {e}",
                                 file=self.spec) from None
        pos = 0
        while pos < hi and not deadline.expired():
            pos = max(pos, self._consume(1.0))
        if pos < hi:
            raise RuntimeFailure("the Kafka store did not load in time", file=self.spec,
                                 expected=f"offset {hi}", found=f"offset {pos}")
        with self.lock:
            self._scan()  # files written while nobody synced (e.g. a first run)
        self.producer.flush(timeout)

    # -- sync -----------------------------------------------------------------------------
    def _consume(self, wait: float) -> int:
        """Apply available records; returns the next offset to read (0 when none came)."""
        # librdkafka loads with the first call that reaches a broker (start-up time)
        from confluent_kafka import KafkaError

        nxt = 0
        first = True
        while True:
            m = self.consumer.poll(wait if first else 0)
            first = False
            if m is None:
                return nxt
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    self.consumed = max(self.consumed, m.offset())
                    return max(nxt, m.offset())
                continue
            nxt = m.offset() + 1
            self._apply(m)
            self.consumed = max(self.consumed, nxt)

    def _apply(self, m) -> None:
        hdrs = dict(m.headers() or [])
        if hdrs.get("origin", b"").decode() == self.origin:
            return
        key = m.key().decode()
        if not _safe_key(key):
            return
        mtime = int(hdrs.get("mtime", b"0").decode() or 0)
        path = self.root / key
        text = None if m.value() is None else m.value().decode()
        if key.startswith(LEASES):
            self._apply_lease(key, text)
            return
        with self.lock:
            try:
                local = path.stat().st_mtime_ns
            except FileNotFoundError:
                local = None
            if local is not None and local >= mtime:
                return  # ours is newer
            if text is None:
                if local is not None:
                    path.unlink(missing_ok=True)
                self.known[key] = None
                return
            atomic_write(path, text)
            os.utime(path, ns=(mtime, mtime))
            self.known[key] = _digest(text)

    def _apply_lease(self, key: str, text: str | None) -> None:
        """A lease record applies when its (epoch, seq) is above the mirror's: a stale copy
        (an older renewal, a fenced owner's) never overwrites a newer take."""
        new = _lease_order(text)
        if new is None:
            return
        path = self.root / key
        with self.lock:
            try:
                have = _lease_order(path.read_text())
            except (FileNotFoundError, UnicodeDecodeError):
                have = None
            if have is not None and have >= new:
                return
            atomic_write(path, text or "")

    def _scan(self) -> None:
        seen = set()
        for dirpath, dirnames, filenames in os.walk(self.root):
            rel = Path(dirpath).relative_to(self.root)
            if rel.parts[:1] and rel.parts[0] in LOCAL_ONLY:
                dirnames[:] = []
                continue
            for name in filenames:
                if name.startswith(".") or name.endswith(".lock"):
                    continue
                key = (rel / name).as_posix()
                if key.startswith(LEASES):
                    continue  # published by their owners only (lease_publish)
                path = self.root / key
                try:
                    text = path.read_text()
                    mtime = path.stat().st_mtime_ns
                except (FileNotFoundError, UnicodeDecodeError):
                    continue
                seen.add(key)
                d = _digest(text)
                if self.known.get(key) != d:
                    self._produce(key, text, mtime)
                    self.known[key] = d
        for key, d in list(self.known.items()):
            if d is not None and key not in seen:
                self._produce(key, None, time.time_ns())
                self.known[key] = None

    def _produce(self, key: str, text: str | None, mtime: int) -> None:
        self.producer.produce(self.topic, text.encode() if text is not None else None,
                              key.encode(), headers=[("origin", self.origin.encode()),
                                                     ("mtime", str(mtime).encode())])
        self.producer.poll(0)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._consume(self.interval)
                with self.lock:
                    self._scan()
            except Exception:  # a broker hiccup: keep syncing, flush() reports failures
                time.sleep(self.interval)

    def flush(self, timeout: float = 30.0) -> None:
        """Publish every local change now and wait until the broker has it."""
        with self.lock:
            self._scan()
        left = self.producer.flush(timeout)
        if left:
            raise RuntimeFailure(f"{left} store record(s) not written to Kafka within "
                                 f"{timeout:.0f}s", file=self.spec)

    def sync(self, timeout: float = 30.0) -> None:
        """Wait until every record committed to the topic so far is applied here (a take of
        a lease committed by another host is then in the mirror)."""
        # librdkafka loads with the first call that reaches a broker (start-up time)
        from confluent_kafka import TopicPartition

        deadline = Deadline(timeout)
        tp = TopicPartition(self.topic, 0)
        _, hi = retry(lambda t: self.consumer.get_watermark_offsets(tp, timeout=t),
                      deadline, "the Kafka store's end")
        while self.consumed < hi:
            # a transaction still open (another owner taking a lease) holds the end back
            # until it commits or aborts
            deadline.sleep(0.02, f"the Kafka store to be read to offset {hi}")

    def lease_fence(self, query: str, timeout: float) -> None:
        """Become the only writer of ``query``'s lease: ``init_transactions`` of its
        transactional producer fences every earlier one (their next commit fails); then
        read the store to its end."""
        # librdkafka loads with the first call that reaches a broker (start-up time)
        from confluent_kafka import KafkaException, Producer

        if query not in self.leasers:
            p = Producer(client_conf(self.bootstrap, **{
                "transactional.id": f"theseus-lease.{self.topic}.{query}",
                "transaction.timeout.ms": max(10000, int(timeout * 2000)),
                "linger.ms": 0}))
            try:
                p.init_transactions(timeout)
            except KafkaException as e:
                raise RuntimeFailure(f"cannot take the lease of '{query}' in the Kafka store: "
                                     f"{e}", file=self.spec) from None
            self.leasers[query] = p
        self.sync(timeout)

    def lease_publish(self, query: str, text: str, timeout: float) -> bool:
        """Publish ``query``'s lease in one transaction; False when this producer was fenced
        (another process took the lease since)."""
        # librdkafka loads with the first call that reaches a broker (start-up time)
        from confluent_kafka import KafkaError, KafkaException

        p = self.leasers.get(query)
        if p is None:
            return True  # taken before this mirror existed: nothing to fence with
        key = f"{LEASES}{query}.json"
        try:
            p.begin_transaction()
            p.produce(self.topic, text.encode(), key.encode(),
                      headers=[("origin", self.origin.encode()),
                               ("mtime", str(time.time_ns()).encode())])
            p.commit_transaction(timeout)
        except KafkaException as e:
            err = e.args[0]
            fenced = {getattr(KafkaError, n, None) for n in (
                "_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH")} - {None}
            if err.code() in fenced or err.fatal():
                self.leasers.pop(query, None)
                return False
            try:
                p.abort_transaction(timeout)
            except KafkaException:
                pass
            raise RuntimeFailure(f"cannot write the lease of '{query}' to the Kafka store: "
                                 f"{err}", file=self.spec) from None
        return True

    def close(self) -> None:
        self.flush()
        self._stop.set()
        self.thread.join(5)
        self.consumer.close()


def _lease_order(text: str | None) -> tuple[int, int] | None:
    try:
        doc = json.loads(text or "")
        return int(doc["epoch"]), int(doc["seq"])
    except (ValueError, TypeError, KeyError):
        return None


def _safe_key(key: str) -> bool:
    p = Path(key)
    return not p.is_absolute() and ".." not in p.parts and bool(p.parts) and \
        p.parts[0] not in LOCAL_ONLY
