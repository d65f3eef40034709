"""Topic administration for a migration: the watermarks its steps read, the side topic
``<output>.shadow`` it creates and deletes, and the tombstones of its control records once
it is over.  Every call takes what is left of the run's one deadline."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from compat.errors import MigrationError
from gates import control
from gates.broker import client_conf, watermarks
from gates.deadline import Deadline
from gates.retry import retry
from migrate import sides
from migrate.lease import LeaseLost
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
        # confluent_kafka is imported where it is used: off the import path of the commands
        # that never reach a broker
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient(client_conf(m.bootstrap))
        what = f"the broker {m.bootstrap} to list its topics"
        try:
            listed = retry(lambda t: admin.list_topics(timeout=t).topics, self.deadline, what)
        except KafkaException as e:
            raise MigrationError(f"cannot list the broker's topics: {e}",
                                 file=m.new_plan, found=m.bootstrap) from None
        if topic in listed:
            return
        what = f"the comparison topic '{topic}' to be created"

        def create(timeout: float) -> None:
            # -1: the cluster's default replication factor
            fut = admin.create_topics([NewTopic(topic, partitions, -1, config=config or {})],
                                      request_timeout=timeout)[topic]
            try:
                fut.result(timeout)
            except KafkaException as e:  # created concurrently (a resumed run) is fine
                if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise

        try:
            with self.guard():
                retry(create, self.deadline, what)
        except KafkaException as e:
            raise MigrationError(f"cannot create the comparison topic {topic}: {e}",
                                 file=m.new_plan) from None

    def delete_side_topic(self, m: Migration) -> None:
        """The side topic served the reconciliation only (kept with --compare, for reading)."""
        if not (m.reconciling or m.feeds) or m.compare:
            return
        from confluent_kafka.admin import AdminClient  # as in ensure: off the import path

        topic = sides.compare_topic(m)
        admin = AdminClient(client_conf(m.bootstrap))

        def delete(timeout: float) -> None:
            admin.delete_topics([topic], request_timeout=timeout)[topic].result(timeout)

        try:
            with self.guard():
                retry(delete, self.deadline, f"the side topic '{topic}' to be deleted")
            self.echo(f"  deleted the side topic {topic}")
        except LeaseLost:
            raise
        except Exception as e:  # already gone (a resumed run), or the broker refused
            if "UNKNOWN_TOPIC" not in str(e):
                self.echo(f"  could not delete the side topic {topic}: {e}")

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
            n = control.tombstone_control_events(m.bootstrap, m.id, where,
                                                 deadline=self.deadline)
        self.echo(f"  tombstoned the control records' key in {n} partition(s)")
