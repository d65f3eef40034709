"""One retry policy for every Kafka call Theseus makes: :func:`retry`.

    lo, hi = retry(lambda timeout: consumer.get_watermark_offsets(tp, timeout=timeout),
                   deadline, "the watermarks of topic 't' partition 0")

* **Under the caller's budget.**  Each attempt gets what is left of the caller's
  :class:`~gates.deadline.Deadline` as its timeout (at most ``cap``); a retry that could not
  start before the deadline is not waited for: the last error is raised at once, so the
  caller names what failed (a bare "time ran out" would not say why).
* **One set of retryable errors** (:func:`retryable`): what the broker or librdkafka flags
  as passing by itself, by the client's own hint (librdkafka's ``KafkaError.retriable()``)
  and by the error codes Kafka documents as retriable (:data:`RETRIABLE`), plus the
  transient states librdkafka reports without the flag (:data:`TRANSIENT`).  An error
  librdkafka calls fatal, or one that needs the transaction aborted first, is never
  retried; neither is anything that is not a Kafka error (a bug, a refusal of ours).
* **Exponential backoff**, from ``first`` doubling up to ``cap`` (:class:`Backoff`), each
  wait drawn between half and all of it: the gated source's partitions ask from several
  Spark tasks at once, and a leader election ends for all of them at the same moment.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from gates.deadline import CALL_CAP, Deadline

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

#: The error codes Kafka's protocol guide marks "Retriable: True" (the error table of
#: kafka.apache.org/protocol, "Error Codes"), by code: librdkafka passes a broker's code on
#: as its own, under names of its own for some (UNKNOWN_TOPIC_OR_PART, INVALID_MSG, ...).
RETRIABLE = {
    2: "CORRUPT_MESSAGE", 3: "UNKNOWN_TOPIC_OR_PARTITION", 5: "LEADER_NOT_AVAILABLE",
    6: "NOT_LEADER_OR_FOLLOWER", 7: "REQUEST_TIMED_OUT", 8: "BROKER_NOT_AVAILABLE",
    9: "REPLICA_NOT_AVAILABLE", 13: "NETWORK_EXCEPTION", 14: "COORDINATOR_LOAD_IN_PROGRESS",
    15: "COORDINATOR_NOT_AVAILABLE", 16: "NOT_COORDINATOR", 19: "NOT_ENOUGH_REPLICAS",
    20: "NOT_ENOUGH_REPLICAS_AFTER_APPEND", 41: "NOT_CONTROLLER", 56: "KAFKA_STORAGE_ERROR",
    70: "FETCH_SESSION_ID_NOT_FOUND", 71: "INVALID_FETCH_SESSION_EPOCH",
    72: "LISTENER_NOT_FOUND", 74: "FENCED_LEADER_EPOCH", 75: "UNKNOWN_LEADER_EPOCH",
    78: "OFFSET_NOT_AVAILABLE", 80: "PREFERRED_LEADER_NOT_AVAILABLE",
    83: "ELIGIBLE_LEADERS_NOT_AVAILABLE", 84: "ELECTION_NOT_NEEDED",
    88: "UNSTABLE_OFFSET_COMMIT", 89: "THROTTLING_QUOTA_EXCEEDED", 100: "UNKNOWN_TOPIC_ID",
    103: "INCONSISTENT_TOPIC_ID", 106: "FETCH_SESSION_TOPIC_ID_ERROR",
}

#: What passes by itself but carries no retriable flag: librdkafka's own states of a broker
#: connection (a request that timed out, a broker down or dropped from the metadata while a
#: request waited on it: ``_DESTROY_BROKER``, "destroyed without termination", the client
#: itself lives on), a coordinator still being looked up, a topic or partition its metadata
#: does not have yet (its own UNKNOWN_TOPIC_OR_PARTITION: a topic just created), and
#: CONCURRENT_TRANSACTIONS (the coordinator still writing the previous transaction's
#: markers: Kafka's table says not retriable, but its own producer retries it, and so must
#: one that commits right after).
TRANSIENT = frozenset((
    "_TRANSPORT", "_TIMED_OUT", "_ALL_BROKERS_DOWN", "_DESTROY_BROKER", "_WAIT_COORD",
    "_UNKNOWN_TOPIC", "_UNKNOWN_PARTITION", "CONCURRENT_TRANSACTIONS",
))


def _error_of(e: BaseException | Any) -> Any:
    """The ``KafkaError`` of a ``KafkaException`` (or ``e`` itself when it is one)."""
    if hasattr(e, "code") and hasattr(e, "retriable"):
        return e
    err = e.args[0] if isinstance(e, BaseException) and e.args else None
    return err if hasattr(err, "code") and hasattr(err, "retriable") else None


def retryable(e: BaseException | Any) -> bool:
    """Whether asking again may succeed: a future that did not answer in time, or a Kafka
    error (a ``KafkaException`` or a ``KafkaError``, as a consumed message carries) that is
    neither fatal nor in need of a transaction abort, and that librdkafka flags retriable or
    whose code is in :data:`RETRIABLE` or :data:`TRANSIENT`."""
    if isinstance(e, TimeoutError):
        return True
    err = _error_of(e)
    if err is None:
        return False
    if err.fatal() or (hasattr(err, "txn_requires_abort") and err.txn_requires_abort()):
        return False
    return bool(err.retriable()) or err.code() in RETRIABLE or err.name() in TRANSIENT


@dataclass(frozen=True)
class Backoff:
    """Waits between attempts: ``first``, doubling, at most ``cap`` seconds; each drawn
    between ``1 - jitter`` and all of it."""

    first: float = 0.2
    cap: float = 2.0
    jitter: float = 0.5

    def delays(self, rand: Callable[[], float] = random.random) -> Iterator[float]:
        delay = self.first
        while True:
            yield delay * (1.0 - self.jitter * rand())
            delay = min(2 * delay, self.cap)


BACKOFF = Backoff()


def retry(call: Callable[[float], T], deadline: Deadline | float, what: str, *,
          cap: float = CALL_CAP, backoff: Backoff = BACKOFF,
          sleep: Callable[[float], None] | None = None) -> T:
    """``call(timeout)`` until it returns, asked again after a :func:`retryable` error.

    ``timeout`` is what is left of ``deadline`` (a :class:`~gates.deadline.Deadline` or
    seconds), at most ``cap``: pass it to the Kafka call.  A retryable error is followed by
    a wait of the :class:`Backoff` and another attempt, while one can start before the
    deadline; then, or at once for any other error, the last error is raised as it is, for
    the caller to name what failed.  Raises :class:`~compat.errors.DeadlineExceeded`
    (naming ``what``) only when nothing was left of the deadline for a first attempt.
    ``sleep`` is for tests.
    """
    deadline = Deadline.of(deadline)
    waits = backoff.delays()
    last: Exception | None = None
    while True:
        if last is not None and deadline.expired():  # the sleep overran: say what failed
            raise last
        timeout = deadline.timeout(what, cap)
        try:
            return call(timeout)
        except Exception as e:
            if not retryable(e):
                raise
            delay = next(waits)
            if deadline.remaining() <= delay:
                raise
            last = e
        (sleep or time.sleep)(delay)


class Unanswered(Exception):
    """:func:`retry_each` gave up on ``key``: ``error`` is its last answer."""

    def __init__(self, key: Any, error: BaseException) -> None:
        super().__init__(key, error)
        self.key, self.error = key, error


def retry_each(ask: Callable[[list[K], float], Mapping[K, Any]], keys: Iterable[K],
               deadline: Deadline | float, what: str, *, cap: float = CALL_CAP,
               sleep: Callable[[float], None] | None = None) -> dict[K, Any]:
    """The answers to one request about many keys (the offsets of a topic's partitions,
    the permissions on topics), each a value or an exception: ``ask(keys, timeout)``.

    The keys answered with an exception are asked again, in one request, as :func:`retry`
    asks again (while every error is retryable and the deadline lasts).  Returns every
    key's value; raises :class:`Unanswered` naming the key that failed and its error (a
    lasting error first), or :class:`~compat.errors.DeadlineExceeded` as :func:`retry`."""
    done: dict[K, Any] = {}
    todo = list(dict.fromkeys(keys))
    failed: dict[K, BaseException] = {}

    def attempt(timeout: float) -> None:
        answers = ask(list(todo), timeout)
        failed.clear()
        for k in todo:
            v = answers[k]
            if isinstance(v, BaseException):
                failed[k] = v
            else:
                done[k] = v
        todo[:] = list(failed)
        if failed:
            raise next((e for e in failed.values() if not retryable(e)),
                       next(iter(failed.values())))

    try:
        retry(attempt, deadline, what, cap=cap, sleep=sleep)
    except Exception as e:
        key = next((k for k, x in failed.items() if x is e), None)
        if key is None:  # raised by ask itself, not an answer
            raise
        raise Unanswered(key, e) from e
    return done


__all__ = ["BACKOFF", "RETRIABLE", "TRANSIENT", "Backoff", "Unanswered", "retry",
           "retry_each", "retryable"]
