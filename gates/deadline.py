"""One time budget for a whole migration, shared by every wait and every Kafka call.

The habit of quix-streams' ``deadline.py``: rather than each call taking a fixed timeout of
its own (30 s here, 10 s there, adding up to far more than the user asked for), the migrator
makes one :class:`Deadline` from ``--timeout`` and hands it down.  Each call takes what is
left (:meth:`Deadline.timeout`), capped so that one slow call cannot spend the budget of the
others; running out raises one :class:`~compat.errors.DeadlineExceeded` naming what was being
waited for.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from compat.errors import DeadlineExceeded

# One Kafka call never waits longer than this, however much budget is left: a broker that
# has not answered in 30 s is reported as such instead of silently eating the budget.
CALL_CAP = 30.0


class Deadline:
    """An end time on the monotonic clock; ``clock`` is for tests."""

    def __init__(self, seconds: float, *, hint: str | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self.seconds = float(seconds)
        self.hint = hint
        self._clock = clock or time.monotonic
        self.end = self._clock() + self.seconds

    @classmethod
    def of(cls, budget: Deadline | float) -> Deadline:
        """``budget`` itself, or a new deadline of that many seconds."""
        return budget if isinstance(budget, Deadline) else cls(budget)

    def remaining(self) -> float:
        """Seconds left, never negative."""
        return max(0.0, self.end - self._clock())

    def expired(self) -> bool:
        return self.remaining() <= 0.0

    def within(self, seconds: float) -> Deadline:
        """A shorter budget inside this one: ends after ``seconds`` or with this one."""
        child = Deadline(0.0, hint=self.hint, clock=self._clock)
        child.seconds = min(float(seconds), self.remaining())
        child.end = min(self.end, self._clock() + float(seconds))
        return child

    def error(self, what: str) -> DeadlineExceeded:
        return DeadlineExceeded(f"the time budget of {self.seconds:g} s ran out waiting for "
                                f"{what}", hint=self.hint)

    def check(self, what: str) -> None:
        """Raise :class:`DeadlineExceeded` naming ``what`` once the budget is spent."""
        if self.expired():
            raise self.error(what)

    def timeout(self, what: str, cap: float = CALL_CAP) -> float:
        """The timeout for one call waiting for ``what``: what is left, at most ``cap``.
        Raises :class:`DeadlineExceeded` when nothing is left."""
        left = self.remaining()
        if left <= 0.0:
            raise self.error(what)
        return min(cap, left)

    def sleep(self, seconds: float, what: str) -> None:
        """Sleep ``seconds`` (less when the budget ends sooner), then :meth:`check`."""
        time.sleep(min(seconds, self.remaining()))
        self.check(what)
