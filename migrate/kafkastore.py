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

``migrate.store`` imports this module, never the other way round; both write files through
:func:`gates.files.atomic_write`.
"""

from __future__ import annotations

import hashlib
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
                    return max(nxt, m.offset())
                continue
            nxt = m.offset() + 1
            self._apply(m)

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

    def close(self) -> None:
        self.flush()
        self._stop.set()
        self.thread.join(5)
        self.consumer.close()


def _safe_key(key: str) -> bool:
    p = Path(key)
    return not p.is_absolute() and ".." not in p.parts and bool(p.parts) and \
        p.parts[0] not in LOCAL_ONLY
