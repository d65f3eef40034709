"""Topic administration for a migration: the watermarks its steps read, the side topic
``<output>.shadow`` it creates and deletes, and the tombstones of its control records once
it is over.  Every call takes what is left of the run's one deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from compat.errors import TheseusError
from gates import control
from gates.broker import client_conf, create_topic, topics_of, watermarks
from gates.deadline import Deadline
from gates.retry import retry
from migrate import sides
from migrate.lease import LeaseLost
from migrate.plantopics import control_layout
from migrate.record import Migration, int_offsets


class TopicAdmin:
    def __init__(self, deadline: Deadline, echo: Callable[[str], None],
                 guard: Callable[[], AbstractContextManager[Any]] = nullcontext) -> None:
        self.deadline = deadline
        self.echo = echo
        self.guard = guard  # topics created, deleted and written: writes of the migrator

    def high_watermarks(self, bootstrap: str, topics: list[str]
                        ) -> dict[str, dict[int, int]]:
        return watermarks(bootstrap, topics, self.deadline)

    def low_watermarks(self, bootstrap: str, topics: list[str]
                       ) -> dict[str, dict[int, int]]:
        return watermarks(bootstrap, topics, self.deadline, low=True)

    def ensure(self, m: Migration, topic: str, partitions: int,
               config: dict[str, str] | None = None) -> None:
        """Create ``topic`` unless it exists (the side topic of ``m``'s shadow)."""
        if topic not in topics_of(m.bootstrap, self.deadline):
            with self.guard():
                create_topic(m.bootstrap, topic, partitions, config, self.deadline)

    def present(self, bootstrap: str) -> dict[str, int]:
        """The topics of the cluster and their partition counts."""
        return topics_of(bootstrap, self.deadline)

    def delete_side_topic(self, m: Migration) -> None:
        """The side topic served the reconciliation only (kept with --compare, for reading)."""
        if not (m.reconciling or m.feeds) or m.compare:
            return
        self.delete_topic(m.bootstrap, sides.compare_topic(m))

    def delete_topic(self, bootstrap: str, topic: str) -> None:
        """Delete a topic the migration created; one already gone is fine (a resumed run)."""
        from confluent_kafka.admin import AdminClient  # as in ensure: off the import path

        admin = AdminClient(client_conf(bootstrap))

        def delete(timeout: float) -> None:
            admin.delete_topics([topic], request_timeout=timeout)[topic].result(timeout)

        try:
            with self.guard():
                retry(delete, self.deadline, f"the topic '{topic}' to be deleted")
        except LeaseLost:
            raise
        except Exception as e:  # already gone (a resumed run), or the broker refused
            if "UNKNOWN_TOPIC" not in str(e):
                self.echo(f"  could not delete the topic {topic}: {e}")
            return
        # Deletion ends after the call returns: a migration started next would find the
        # topic still listed, skip creating it, and write into a topic being deleted.
        wait, listed = self.deadline.within(30), True
        try:
            while listed and not wait.expired():
                listed = topic in topics_of(bootstrap, wait)
                if listed:
                    time.sleep(0.2)
        except TheseusError:  # the broker did not answer in time: still listed, as said
            pass
        self.echo(f"  deleted the topic {topic}" if not listed else
                  f"  asked the broker to delete the topic {topic} (still listed after 30 s)")

    def tombstone_controls(self, m: Migration) -> None:
        """The migration is over: its control records need not stay in compacted topics
        (in the source topics, and the output topic of a cascade's upstream)."""
        if m.cut_mode != "control-events" or not (m.cut or m.out_cut):
            return
        # a downstream's cut is its upstream's control events (the upstream tombstones
        # them); one in the middle of a chain still propagated its own into its output
        where = {**({} if m.cut_from else int_offsets(m.cut)), **int_offsets(m.out_cut)}
        if not where:
            return
        with self.guard():
            n = control.tombstone_control_events(
                m.bootstrap, m.id, where, deadline=self.deadline,
                keyless_topics=control_layout(m.new_plan, m.old_plan)["keyless_topics"])
        self.echo(f"  tombstoned the control records' key in {n} partition(s)")
