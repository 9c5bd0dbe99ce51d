"""Write pacing: at most one write per interval while events keep coming, none delayed otherwise.

On loopback a socket write costs a syscall and a wake-up of the reader, far more than encoding one
event; a burst written event by event is bound by that. A pacer lets the first write after a quiet
spell go out at once and holds later ones until `interval_s` after the previous write, so a burst
leaves in a few large writes and an isolated event gains no latency.
"""

from __future__ import annotations

import time


class WritePacer:
    def __init__(self, interval_s: float) -> None:
        self._interval_s = interval_s
        self._last = float("-inf")

    def pause(self) -> float:
        """Seconds to wait before the next write (0 when it may go now)."""
        return max(0.0, self._last + self._interval_s - time.monotonic())

    def wrote(self) -> None:
        self._last = time.monotonic()
