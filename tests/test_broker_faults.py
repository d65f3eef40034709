"""The driver side of the gated source survives a broker's death: listing offsets retries
while a partition has no leader, and still fails at once on a permanent error."""

from __future__ import annotations

import pytest

import gates.source as source
from compat.errors import SourceError
from gates.retry import retryable


class _Fut:
    def __init__(self, offset=None, exc=None):
        self.offset, self.exc = offset, exc

    def result(self, timeout=None):
        if self.exc is not None:
            raise self.exc
        from types import SimpleNamespace

        return SimpleNamespace(offset=self.offset)


class _Admin:
    def __init__(self, script):
        self.script = list(script)  # per call: {partition: offset | exception}
        self.calls = []

    def list_offsets(self, req, isolation_level=None, request_timeout=None):
        answer = self.script.pop(0)
        self.calls.append(sorted(tp.partition for tp in req))
        return {tp: (_Fut(exc=answer[tp.partition])
                     if isinstance(answer[tp.partition], BaseException)
                     else _Fut(answer[tp.partition])) for tp in req}


def _err(code):
    from confluent_kafka import KafkaError, KafkaException

    return KafkaException(KafkaError(code))


def _opts():
    return source.SourceOptions.parse({"bootstrap": "h:1", "topic": "t", "format": "string"})


def test_a_partition_without_leader_is_asked_again(monkeypatch):
    from confluent_kafka import KafkaError

    admin = _Admin([{0: 5, 1: _err(KafkaError.NOT_LEADER_FOR_PARTITION), 2: 7},
                    {1: _err(KafkaError.LEADER_NOT_AVAILABLE)},
                    {1: 6}])
    monkeypatch.setattr(source, "_admin", lambda opts: admin)
    monkeypatch.setattr(source.time, "sleep", lambda s: None)
    assert source._list_offsets(_opts(), [0, 1, 2], "latest") == {0: 5, 1: 6, 2: 7}
    assert admin.calls == [[0, 1, 2], [1], [1]]


def test_a_permanent_error_fails_at_once(monkeypatch):
    from confluent_kafka import KafkaError

    admin = _Admin([{0: _err(KafkaError.TOPIC_AUTHORIZATION_FAILED)}])
    monkeypatch.setattr(source, "_admin", lambda opts: admin)
    with pytest.raises(SourceError) as e:
        source._list_offsets(_opts(), [0], "latest")
    assert "partition 0" in e.value.render() and len(admin.calls) == 1


def test_a_leader_that_never_comes_back_fails_after_the_wait(monkeypatch):
    from confluent_kafka import KafkaError

    clock = [0.0]
    monkeypatch.setattr(source.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(source.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    admin = _Admin([{0: _err(KafkaError.LEADER_NOT_AVAILABLE)}] * 1000)
    monkeypatch.setattr(source, "_admin", lambda opts: admin)
    with pytest.raises(SourceError, match="cannot list the latest offset"):
        source._list_offsets(_opts(), [0], "latest")
    assert source.LEADER_WAIT - 3 <= clock[0] <= source.LEADER_WAIT


class _Consumer:
    """A consumer whose partition 1 has no leader for its first two watermark queries."""

    fails = 2

    def __init__(self, conf):
        self.asked = []

    def list_topics(self, topic, timeout=None):
        from types import SimpleNamespace

        return SimpleNamespace(topics={topic: SimpleNamespace(
            error=None, partitions={0: None, 1: None})})

    def get_watermark_offsets(self, tp, timeout=None):
        from confluent_kafka import KafkaError

        self.asked.append(tp.partition)
        if tp.partition == 1 and _Consumer.fails:
            _Consumer.fails -= 1
            raise _err(KafkaError.NOT_LEADER_FOR_PARTITION)
        return 0, 10 + tp.partition

    def close(self):
        pass


def test_the_migrators_watermarks_wait_for_a_new_leader(monkeypatch):
    import confluent_kafka
    from confluent_kafka import KafkaError

    from compat.errors import BrokerError
    from gates import broker

    monkeypatch.setattr(confluent_kafka, "Consumer", _Consumer)
    monkeypatch.setattr(broker.time, "sleep", lambda s: None)
    _Consumer.fails = 2
    assert broker.watermarks("h:1", ["t"]) == {"t": {0: 10, 1: 11}}
    # a request that waited on a broker librdkafka dropped when it left the metadata (seen
    # on the three-broker cluster: it failed the migration's pause)
    calls = {"n": 0}
    real = _Consumer.get_watermark_offsets

    def dropped_once(self, tp, timeout=None):
        calls["n"] += 1
        if calls["n"] == 1:
            raise _err(KafkaError._DESTROY_BROKER)
        return real(self, tp, timeout)

    monkeypatch.setattr(_Consumer, "get_watermark_offsets", dropped_once)
    assert broker.watermarks("h:1", ["t"]) == {"t": {0: 10, 1: 11}} and calls["n"] == 3
    assert not retryable(_err(KafkaError._DESTROY))  # the client closing: final

    def denied(self, tp, timeout=None):
        raise _err(KafkaError.TOPIC_AUTHORIZATION_FAILED)

    monkeypatch.setattr(_Consumer, "get_watermark_offsets", denied)
    with pytest.raises(BrokerError, match="cannot read the watermarks"):
        broker.watermarks("h:1", ["t"])


def test_a_new_leader_whose_high_watermark_lags_is_asked_again(monkeypatch):
    """Right after an election the new leader answers ListOffsets with OFFSET_NOT_AVAILABLE
    until its high watermark has caught up (seen on the three-broker cluster: the old query
    failed on it); librdkafka does not flag it retriable."""
    from confluent_kafka import KafkaError

    assert not _err(KafkaError.OFFSET_NOT_AVAILABLE).args[0].retriable()
    admin = _Admin([{0: _err(KafkaError.OFFSET_NOT_AVAILABLE), 1: 4},
                    {0: _err(KafkaError.FENCED_LEADER_EPOCH)}, {0: 9}])
    monkeypatch.setattr(source, "_admin", lambda opts: admin)
    monkeypatch.setattr(source.time, "sleep", lambda s: None)
    assert source._list_offsets(_opts(), [0, 1], "latest") == {0: 9, 1: 4}
    assert admin.calls == [[0, 1], [0], [0]]


class _DescribeAdmin:
    """describe_topics answering from a script: per call, {topic: ops | exception}."""

    def __init__(self, script):
        self.script, self.calls = list(script), 0

    def describe_topics(self, topics, include_authorized_operations=False,
                        request_timeout=None):
        from types import SimpleNamespace

        from confluent_kafka.admin import AclOperation

        answer = self.script.pop(0)
        self.calls += 1
        out = {}
        for t in topics.topic_names:
            v = answer[t]
            out[t] = _Fut(exc=v) if isinstance(v, BaseException) else SimpleNamespace(
                result=lambda timeout=None, v=v: SimpleNamespace(
                    authorized_operations=[getattr(AclOperation, o) for o in v]))
        return out


def test_check_access_asks_again_while_a_broker_is_down(monkeypatch):
    """The permission check before a query starts: a request stuck on a broker that died
    (the future times out) or a leader moving is asked again within the deadline; a refused
    permission still fails on the first answer."""
    from confluent_kafka import KafkaError

    from compat.errors import BrokerError
    from gates import broker

    monkeypatch.setattr(broker.time, "sleep", lambda s: None)
    admin = _DescribeAdmin([{"in": TimeoutError(), "out": ["WRITE"]},
                            {"in": _err(KafkaError._TRANSPORT)},
                            {"in": ["READ"]}])
    broker.check_access("h:1", [("in", "READ", "r"), ("out", "WRITE", "w")], client=admin)
    assert admin.calls == 3
    admin = _DescribeAdmin([{"in": _err(KafkaError._TRANSPORT)}, {"in": ["DESCRIBE"]}])
    with pytest.raises(BrokerError, match="no READ permission"):
        broker.check_access("h:1", [("in", "READ", "r")], client=admin)
    admin = _DescribeAdmin([{"in": _err(KafkaError.INVALID_REQUEST)}])
    with pytest.raises(BrokerError, match="cannot describe the topic"):
        broker.check_access("h:1", [("in", "READ", "r")], client=admin)
    assert admin.calls == 1


class _TxnProducer:
    """A transactional producer; the first one's offset commit hangs (as librdkafka's does
    when the group coordinator left the cluster), beyond its own timeout."""

    made: list = []

    def __init__(self, conf):
        self.log, self.hangs = [], not _TxnProducer.made
        _TxnProducer.made.append(self)

    def init_transactions(self, timeout=None):
        self.log.append("init")

    def begin_transaction(self):
        self.log.append("begin")

    def produce(self, topic, value, key=None):
        self.log.append(("produce", value))

    def poll(self, timeout=None):
        return 0

    def send_offsets_to_transaction(self, offsets, meta, timeout=None):
        import threading

        if self.hangs:
            threading.Event().wait(3)  # "forever" for the test: beyond its bound
        self.log.append(("offsets", offsets[0].metadata))

    def commit_transaction(self, timeout=None):
        self.log.append("commit")

    def abort_transaction(self, timeout=None):
        self.log.append("abort")


def test_a_hung_offset_commit_is_written_again_by_a_new_producer(monkeypatch, capsys):
    import confluent_kafka

    from gates import sink as sinkmod

    monkeypatch.setattr(confluent_kafka, "Producer", _TxnProducer)
    monkeypatch.setattr(sinkmod, "HUNG_CALL", 0.2)
    _TxnProducer.made = []
    s = sinkmod.KafkaSink("h:1", "out", [], "q", "exactly_once", timeout=1.0)
    from types import SimpleNamespace

    s._consumer = SimpleNamespace(consumer_group_metadata=lambda: "meta")
    s._write_transaction("out", [None], [b"row"], 7)
    first, second = _TxnProducer.made
    # the stuck producer got no other call (an abort would conflict with it); the new one
    # (whose init fences it) wrote the whole batch and committed batch id 7
    assert first.log == ["init", "begin", ("produce", b"row")]
    assert second.log == ["init", "begin", ("produce", b"row"), ("offsets", "7"), "commit"]
    assert "did not return within" in capsys.readouterr().err
    assert s._known == (7,)
