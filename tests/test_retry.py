"""Issue 26: one retry policy for every Kafka call (``gates.retry``), under the caller's
Deadline.  The Kafka calls are fakes and the clock is a fake that the fake sleep moves:
nothing here talks to a broker or waits."""

from __future__ import annotations

import ast

import pytest
from confluent_kafka import KafkaError, KafkaException

from compat.errors import DeadlineExceeded
from gates.deadline import Deadline
from gates.retry import (
    RETRIABLE,
    Backoff,
    Unanswered,
    retry,
    retry_each,
    retryable,
)
from tests.conftest import ROOT


def err(code, **flags) -> KafkaException:
    return KafkaException(KafkaError(code, **flags))


class Clock:
    """A monotonic clock that moves only when the fake sleep sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.slept.append(seconds)
        self.now += seconds


class Flaky:
    """A Kafka call failing with ``errors`` in turn, then answering ``answer``; records the
    timeout each attempt was given."""

    def __init__(self, errors, answer="ok") -> None:
        self.errors, self.answer, self.timeouts = list(errors), answer, []

    def __call__(self, timeout: float):
        self.timeouts.append(timeout)
        if self.errors:
            raise self.errors.pop(0)
        return self.answer


NO_JITTER = Backoff(first=0.2, cap=2.0, jitter=0.0)


def test_a_retriable_error_is_asked_again_with_a_doubling_capped_backoff():
    clock = Clock()
    call = Flaky([err(KafkaError.LEADER_NOT_AVAILABLE)] * 6)
    got = retry(call, Deadline(60, clock=clock), "the watermarks", backoff=NO_JITTER,
                sleep=clock.sleep)
    assert got == "ok" and len(call.timeouts) == 7
    assert clock.slept == [0.2, 0.4, 0.8, 1.6, 2.0, 2.0]


def test_jitter_draws_each_wait_between_half_and_all_of_it():
    waits = Backoff(first=1.0, cap=4.0, jitter=0.5).delays(rand=iter([0.0, 1.0, 0.5]).__next__)
    assert [next(waits) for _ in range(3)] == [1.0, 1.0, 3.0]


def test_a_fatal_error_is_raised_at_once_whatever_its_code():
    clock = Clock()
    fatal = err(KafkaError.NOT_COORDINATOR, fatal=True)  # retriable by its code, but fatal
    call = Flaky([fatal])
    with pytest.raises(KafkaException) as e:
        retry(call, Deadline(60, clock=clock), "x", sleep=clock.sleep)
    assert e.value is fatal and len(call.timeouts) == 1 and clock.slept == []


@pytest.mark.parametrize("error", [
    err(KafkaError.TOPIC_AUTHORIZATION_FAILED),  # Kafka: not retriable
    err(KafkaError.NOT_COORDINATOR, txn_requires_abort=True),  # abort first, then again
    err(KafkaError._DESTROY),  # the client itself is closing
    ValueError("a bug of ours"),  # not a Kafka error at all
])
def test_what_does_not_pass_by_itself_is_raised_at_once(error):
    clock = Clock()
    call = Flaky([error])
    with pytest.raises(type(error)):
        retry(call, Deadline(60, clock=clock), "x", sleep=clock.sleep)
    assert len(call.timeouts) == 1 and clock.slept == []


def test_the_brokers_own_hint_is_honoured():
    """An error whose code Theseus does not list is asked again when librdkafka flags it
    retriable; the same code without the flag is not."""
    assert KafkaError.INVALID_REQUEST not in RETRIABLE
    clock = Clock()
    call = Flaky([err(KafkaError.INVALID_REQUEST, retriable=True)])
    assert retry(call, Deadline(60, clock=clock), "x", sleep=clock.sleep) == "ok"
    assert len(call.timeouts) == 2
    call = Flaky([err(KafkaError.INVALID_REQUEST)])
    with pytest.raises(KafkaException):
        retry(call, Deadline(60, clock=clock), "x", sleep=clock.sleep)
    assert len(call.timeouts) == 1


@pytest.mark.parametrize("code", [KafkaError.NOT_LEADER_FOR_PARTITION,
                                  KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                                  KafkaError.OFFSET_NOT_AVAILABLE,
                                  KafkaError.UNSTABLE_OFFSET_COMMIT,
                                  KafkaError._TRANSPORT, KafkaError._DESTROY_BROKER,
                                  KafkaError.CONCURRENT_TRANSACTIONS])
def test_kafkas_documented_and_librdkafkas_transient_errors_are_retryable(code):
    e = err(code)
    assert not e.args[0].retriable()  # librdkafka does not flag these: the table does
    assert retryable(e) and retryable(e.args[0])  # as raised, and as a message carries it


def test_a_future_that_did_not_answer_in_time_is_asked_again():
    clock = Clock()
    call = Flaky([TimeoutError()])
    assert retry(call, Deadline(60, clock=clock), "x", sleep=clock.sleep) == "ok"


def test_it_never_sleeps_past_the_deadline_and_then_names_the_last_error():
    clock = Clock()
    last = err(KafkaError.LEADER_NOT_AVAILABLE)
    call = Flaky([err(KafkaError.LEADER_NOT_AVAILABLE)] * 50 + [last])
    with pytest.raises(KafkaException) as e:
        retry(call, Deadline(10, clock=clock), "x", backoff=NO_JITTER, sleep=clock.sleep)
    assert e.value.args[0].code() == KafkaError.LEADER_NOT_AVAILABLE  # not "time ran out"
    assert sum(clock.slept) <= 10  # no sleep ends after the deadline
    assert 100 + 10 - 2.0 <= clock.now <= 100 + 10  # but it used what there was
    # every attempt got what was left of the budget as its timeout, never more
    start = 100.0
    for timeout, slept in zip(call.timeouts, [0.0] + clock.slept):
        start += slept
        assert 0 < timeout <= 110 - start + 1e-9


def test_each_attempt_is_capped_and_a_spent_budget_raises_naming_what():
    clock = Clock()
    call = Flaky([err(KafkaError._TIMED_OUT)])
    retry(call, Deadline(100, clock=clock), "x", cap=7.0, sleep=clock.sleep)
    assert call.timeouts[0] == 7.0
    spent = Deadline(5, clock=clock)
    clock.now += 6
    with pytest.raises(DeadlineExceeded, match="the group coordinator"):
        retry(Flaky([]), spent, "the group coordinator", sleep=clock.sleep)


def test_retry_each_asks_again_only_for_the_keys_that_failed():
    clock = Clock()
    script = [{0: 5, 1: err(KafkaError.NOT_LEADER_FOR_PARTITION), 2: TimeoutError()},
              {1: err(KafkaError.LEADER_NOT_AVAILABLE), 2: 7}, {1: 6}]
    asked = []

    def ask(keys, timeout):
        asked.append(keys)
        return script.pop(0)

    assert retry_each(ask, [0, 1, 2], Deadline(60, clock=clock), "offsets",
                      sleep=clock.sleep) == {0: 5, 1: 6, 2: 7}
    assert asked == [[0, 1, 2], [1, 2], [1]]


def test_retry_each_names_the_key_with_a_lasting_error_first():
    clock = Clock()
    denied = err(KafkaError.TOPIC_AUTHORIZATION_FAILED)

    def ask(keys, timeout):
        return {"a": err(KafkaError._TRANSPORT), "b": denied}

    with pytest.raises(Unanswered) as e:
        retry_each(ask, ["a", "b"], Deadline(60, clock=clock), "x", sleep=clock.sleep)
    assert e.value.key == "b" and e.value.error is denied and clock.slept == []


# -- one policy: nothing else decides what is retried, nothing else makes a clock ---------

CODE = sorted(p for d in ("gates", "migrate") for p in (ROOT / d).rglob("*.py"))


@pytest.mark.parametrize("path", CODE, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_but_the_policy_judges_retriability_or_makes_a_deadline(path):
    """``err.retriable()`` is read by ``gates.retry`` only, and no wait makes a deadline of
    its own from the clock (``time.monotonic() + t``): it takes a Deadline."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    rel = path.relative_to(ROOT).as_posix()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr == "retriable" and rel != "gates/retry.py":
            pytest.fail(f"{rel}:{node.lineno}: judges retriability itself")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            for side in (node.left, node.right):
                if isinstance(side, ast.Call) and isinstance(side.func, ast.Attribute) and \
                        side.func.attr == "monotonic":
                    pytest.fail(f"{rel}:{node.lineno}: a deadline of its own")
