"""The one backoff policy: exponential delays with equal jitter, inside a deadline.

Whatever retries in servelens waits the same way: the alert dispatcher per message, the
writer for the store (a short deadline before it spools; for ever, capped, while it
replays the spool or inserts the write-ahead log), the scrapers inside one scrape. The
delay doubles per attempt up to `max_backoff`, and half of it is random, so retries that
failed together spread out and still slow down. A `Retrying` is one run of attempts
under a policy: it says how long to wait before the next attempt, or that there is none.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Callable

MAX_BACKOFF_SECONDS = 30.0


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int | None  # None: no limit but the deadline
    deadline: float = math.inf  # seconds one run may spend, attempts and waits together
    backoff: float = 0.1  # first delay; doubles per retry up to max_backoff
    max_backoff: float = MAX_BACKOFF_SECONDS

    def delay(self, attempt: int) -> float:
        """The wait after failed attempt number `attempt` (1-based)."""
        base = min(self.max_backoff, self.backoff * 2 ** (attempt - 1))
        return base / 2 + random.uniform(0, base / 2)  # equal jitter: spread out, still growing

    def start(self, clock: Callable[[], float] = time.monotonic) -> Retrying:
        return Retrying(self, clock)


class Retrying:
    """One run of attempts: call `failed()` after each failed attempt."""

    def __init__(self, policy: RetryPolicy, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self._clock = clock
        self.attempts = 0
        self.deadline = clock() + policy.deadline

    def failed(self, at_least: float = 0.0) -> float | None:
        """Count a failed attempt; the wait before the next one (no shorter than
        `at_least`, a server's Retry-After), or None when the attempts or the deadline
        are used up."""
        self.attempts += 1
        wait = max(self.policy.delay(self.attempts), at_least)
        if self.policy.max_attempts is not None and self.attempts >= self.policy.max_attempts:
            return None
        if self._clock() + wait >= self.deadline:
            return None
        return wait

    def reset(self) -> None:
        """After a success: the next failure waits the first delay again."""
        self.attempts = 0
        self.deadline = self._clock() + self.policy.deadline
