"""Process control: the ``theseus run`` instances a migration starts (the shadow; the query
itself when it restarts in place), asks to stop, and watches, through the store's status
records (the old query may run on another host)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from compat.errors import MigrationError
from gates import kafkaconf
from gates.deadline import Deadline
from gates.lease import process_alive
from migrate import sides
from migrate.record import Migration
from migrate.run import failure_message
from migrate.store import DirectoryStore

#: the phases in which both queries must be alive for the migration to go on
WATCHED = ("shadow", "pause", "cut", "align", "propagate")


def pid_alive(pid: int | None) -> bool:
    """Process ``pid`` of this host runs (a zombie child counts as dead)."""
    return bool(pid) and process_alive(int(pid or 0))


def exited(st: dict[str, Any]) -> bool:
    """A status that says starting or running, of a process on this host that is gone."""
    return st.get("status") in ("starting", "running") and bool(st.get("pid")) and \
        st.get("host", socket.gethostname()) == socket.gethostname() and \
        not pid_alive(int(st["pid"]))


def not_running(st: dict[str, Any]) -> str:
    """Why the instance whose status is ``st`` is not running ("" when it is, or may be:
    a process on another host is taken at its status's word)."""
    status = st.get("status")
    if status not in ("starting", "running"):
        return f"its status is {status or 'unknown'}"
    if exited(st):
        return f"its process {st['pid']} on this host is gone (status {status})"
    return ""


def last_error_line(log: Path) -> str:
    """The last line of a query host's log that is not librdkafka's (``%3|...``) or
    Spark's progress: what ``theseus run`` said when it exited."""
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return "no log"
    said = [ln.strip() for ln in lines
            if ln.strip() and not ln.startswith("%") and not ln.startswith("  batch ")]
    return said[-1][:500] if said else "its log is empty"


class Processes:
    """The query hosts of the migrations of one run, as the store records them."""

    def __init__(self, store: DirectoryStore, deadline: Deadline,
                 guard: Callable[[], AbstractContextManager[Any]] = nullcontext) -> None:
        self.store = store
        self.deadline = deadline
        self.guard = guard  # a process start is a write of the migrator (its lease's)

    def spawn(self, m: Migration, plan_path: str, instance: str, generation: int,
              gated: bool) -> int:
        st = self.store.status(instance)
        if st.get("status") in ("starting", "running") and pid_alive(st.get("pid")):
            return int(st["pid"])  # resumed: it is already up
        log = open(self.store.log_path(instance), "ab")
        cmd = [sys.executable, "-m", "migrate.cli", "run", plan_path, "--bootstrap",
               m.bootstrap, "--state", self.store.spec, "--instance", instance,
               "--generation", str(generation), "--master", m.master,
               "--trigger", m.trigger, *kafkaconf.cli_args()]
        if gated:
            cmd.append("--gated-start")
            if sides.side_topic_used(m):
                cmd += ["--shadow-topic", sides.compare_topic(m)]
        with self.guard():
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            self.store.set_status(instance, status="starting", pid=proc.pid)
        return proc.pid

    def running(self, instance: str) -> bool:
        st = self.store.status(instance)
        return st.get("status") == "running" and pid_alive(st.get("pid"))

    def starting(self, instance: str) -> bool:
        st = self.store.status(instance)
        return st.get("status") == "starting" and pid_alive(st.get("pid"))

    def stopped(self, instance: str) -> bool:
        st = self.store.status(instance)
        return st.get("status") in ("stopped", "failed") or not pid_alive(st.get("pid"))

    def check_alive(self, m: Migration, always: bool = False) -> None:
        """A query that failed will never reach H or C: say so now, with its error and log,
        instead of waiting for the deadline. ``always``: whatever the phase (a cascade's
        upstream past its propagation, whose shadow must still reach the cut)."""
        if m.kind != "shadow" or not m.new_instance or (not always and
                                                         m.phase not in WATCHED):
            return
        q = m.query
        for inst, which, hint in (
                (m.new_instance, "shadow", "fix the cause, then theseus migrate abort "
                 f"{q} (the old query keeps running) and start again"),
                (m.old_instance, "old", "fix the cause, restart it with theseus run (its "
                 f"checkpoint keeps its place), then theseus migrate resume {q}; or theseus "
                 f"migrate abort {q}")):
            st = self.store.status(inst)
            if st.get("status") == "failed":
                first = failure_message(str(st.get("error") or "see its log"))[:500]
                raise MigrationError(f"the {which} query '{inst}' failed: {first}",
                                     file=str(self.store.log_path(inst)), hint=hint)
            if which == "shadow" and exited(st):
                # The process the migrator started is gone without recording why (it
                # failed before its query started, or was killed): nothing will restart it.
                # (A dead old query is left alone: its host may restart it on its
                # checkpoint, and the migration then goes on.)
                raise MigrationError(
                    f"the shadow query '{inst}' exited before it ran: "
                    f"{last_error_line(self.store.log_path(inst))}",
                    file=str(self.store.log_path(inst)), hint=hint)

    def wait_stopped(self, m: Migration, seconds: float = 30.0) -> None:
        """After an abort: a shadow still writing would create its side topic again
        (auto-creation), and a downstream one still reading it would fail."""
        inst = m.new_instance
        if not inst or inst == m.old_instance:
            return
        wait = self.deadline.within(seconds)
        while not wait.expired() and not self.stopped(inst):
            time.sleep(0.2)
