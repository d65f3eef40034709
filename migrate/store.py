"""The durable store of queries and migrations (a directory by default).

Layout under the store root (``--state``, default ``.theseus/``):

    queries/<query>/plan.json        the plan the query runs (the deployable artifact)
    queries/<query>/status.json      status, host, pid, checkpoint, updated_at
    queries/<query>/stop             present: the host stops the query after its batch
    checkpoints/<query>/<generation> Spark checkpoints (a migration starts a new one)
    gates/<query>.json               gate state read by the running query's source

Every write is atomic (write a temporary file, then rename), so a crash never leaves a
half-written record behind.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from compat.errors import RuntimeFailure, StoreError
from gates.deadline import Deadline
from gates.files import atomic_remove, atomic_write
from migrate.kafkastore import KafkaMirror, local_dir


def read_json(path: Path, what: str) -> Any:
    """The JSON document in ``path``, or StoreError naming the file (``what`` says what it
    should hold)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise StoreError(f"unreadable {what}", file=str(path), expected="JSON",
                         found=str(e)) from None
    except OSError as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise StoreError(f"cannot read the {what}: {e.strerror or e}",
                         file=str(path)) from None



class DirectoryStore:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()
        self.spec = str(self.root)  # what a child process gets as --state
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RuntimeFailure(f"cannot create the state directory: {e.strerror}",
                                 file=str(root)) from None

    def __str__(self) -> str:
        return str(self.root)

    def flush(self, deadline: Deadline | None = None) -> None:
        """Make every write so far durable where other hosts read it (files: already);
        a migration passes its :class:`~gates.deadline.Deadline`."""

    # queries --------------------------------------------------------------------------
    def query_dir(self, query: str) -> Path:
        return self.root / "queries" / query

    def put_plan(self, query: str, plan_text: str) -> None:
        atomic_write(self.query_dir(query) / "plan.json", plan_text)

    def plan_path(self, query: str) -> Path:
        return self.query_dir(query) / "plan.json"

    def status(self, query: str) -> dict[str, Any]:
        p = self.query_dir(query) / "status.json"
        try:
            doc = read_json(p, "query status")
        except FileNotFoundError:
            return {}
        if not isinstance(doc, dict):
            raise StoreError("malformed query status", file=str(p), pointer="",
                             expected="a JSON object", found=type(doc).__name__)
        return doc

    def set_status(self, query: str, **fields: Any) -> dict[str, Any]:
        cur = self.status(query)
        cur.update(fields)
        cur["updated_at"] = time.time()
        cur.setdefault("host", socket.gethostname())
        atomic_write(self.query_dir(query) / "status.json", json.dumps(cur, indent=2) + "\n")
        return cur

    def checkpoint(self, query: str, generation: int = 0) -> Path:
        return self.root / "checkpoints" / query / str(generation)

    # instances: a migration runs the new plan as a new instance of the same query
    def live_instance(self, query: str) -> str:
        p = self.query_dir(query) / "live"
        return p.read_text().strip() if p.exists() else query

    def set_live(self, query: str, instance: str) -> None:
        atomic_write(self.query_dir(query) / "live", instance)

    def migration_path(self, migration_id: str) -> Path:
        return self.root / "migrations" / f"{migration_id}.json"

    def log_path(self, instance: str) -> Path:
        p = self.root / "logs" / f"{instance}.log"
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def request_stop(self, query: str) -> None:
        atomic_write(self.query_dir(query) / "stop", str(time.time()))

    def stop_requested(self, query: str) -> bool:
        return (self.query_dir(query) / "stop").exists()

    def clear_stop(self, query: str) -> None:
        atomic_remove(self.query_dir(query) / "stop")

    # leases (gates.lease, migrate.lease): one host's files need no more than their lock
    def lease_sync(self, timeout: float) -> None:
        """Have here every lease other hosts wrote so far (Kafka)."""

    def lease_fence(self, query: str, timeout: float) -> None:
        """Before a lease is taken: make earlier holders' writes of it fail (Kafka)."""

    def lease_publish(self, query: str, text: str, timeout: float) -> bool:
        """After the lease was written here: publish it where other hosts read it; False
        when this process was fenced off it (another took it since)."""
        return True


class KafkaStore(DirectoryStore):
    """The same store on a compacted Kafka topic, through a local mirror directory (see
    :mod:`migrate.kafkastore`); ``spec`` is ``kafka://HOST:PORT/TOPIC``."""

    def __init__(self, spec: str) -> None:
        super().__init__(local_dir(spec))
        self.spec = spec
        self.mirror = KafkaMirror(spec, self.root)
        atexit.register(self._final_flush)

    def flush(self, deadline: Deadline | None = None) -> None:
        self.mirror.flush(30.0 if deadline is None else
                          deadline.timeout("the store's records to reach Kafka"))

    def lease_sync(self, timeout: float) -> None:
        self.mirror.sync(timeout)

    def lease_fence(self, query: str, timeout: float) -> None:
        self.mirror.lease_fence(query, timeout)

    def lease_publish(self, query: str, text: str, timeout: float) -> bool:
        return self.mirror.lease_publish(query, text, timeout)

    def _final_flush(self) -> None:
        try:
            self.mirror.flush(10)
        except Exception:
            pass

    def __str__(self) -> str:
        return self.spec


_OPEN: dict[str, DirectoryStore] = {}


def open_store(spec: str) -> DirectoryStore:
    """A directory path, or ``kafka://HOST:PORT/TOPIC`` (one store object per process)."""
    if spec.startswith("kafka://"):
        if spec not in _OPEN:
            _OPEN[spec] = KafkaStore(spec)
        return _OPEN[spec]
    return DirectoryStore(spec)
