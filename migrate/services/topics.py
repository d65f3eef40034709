"""Topic administration for a migration: the watermarks its steps read, the side topic
``<output>.shadow`` it creates and deletes, and the tombstones of its control records once
it is over.  Every call takes what is left of the run's one deadline."""

from __future__ import annotations

from collections.abc import Callable

from compat.errors import MigrationError
from gates import control
from gates.broker import client_conf, watermarks
from gates.deadline import Deadline
from migrate import sides
from migrate.record import Migration, int_offsets


class TopicAdmin:
    def __init__(self, deadline: Deadline, echo: Callable[[str], None]) -> None:
        self.deadline = deadline
        self.echo = echo

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
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient(client_conf(m.bootstrap))
        what = f"the broker {m.bootstrap} to list its topics"
        try:
            if topic in admin.list_topics(timeout=self.deadline.timeout(what)).topics:
                return
        except KafkaException as e:
            self.deadline.check(what)
            raise MigrationError(f"cannot list the broker's topics: {e}",
                                 file=m.new_plan, found=m.bootstrap) from None
        what = f"the comparison topic '{topic}' to be created"
        timeout = self.deadline.timeout(what)
        # -1: the cluster's default replication factor
        fut = admin.create_topics([NewTopic(topic, partitions, -1, config=config or {})],
                                  request_timeout=timeout)[topic]
        try:
            fut.result(timeout)
        except Exception as e:  # created concurrently (a resumed run) is fine
            if "TOPIC_ALREADY_EXISTS" not in str(e):
                self.deadline.check(what)
                raise MigrationError(f"cannot create the comparison topic {topic}: {e}",
                                     file=m.new_plan) from None

    def delete_side_topic(self, m: Migration) -> None:
        """The side topic served the reconciliation only (kept with --compare, for reading)."""
        if not (m.reconciling or m.feeds) or m.compare:
            return
        from confluent_kafka.admin import AdminClient  # as in ensure: off the import path

        topic = sides.compare_topic(m)
        admin = AdminClient(client_conf(m.bootstrap))
        timeout = self.deadline.timeout(f"the side topic '{topic}' to be deleted")
        try:
            admin.delete_topics([topic], request_timeout=timeout)[topic].result(timeout)
            self.echo(f"  deleted the side topic {topic}")
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
        n = control.tombstone_control_events(m.bootstrap, m.id, where, deadline=self.deadline)
        self.echo(f"  tombstoned the control records' key in {n} partition(s)")
