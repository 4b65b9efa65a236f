"""How many tasks to claim beyond the free slots: enough to keep the slots busy for about
PREFETCH_WINDOW seconds at the recent task duration, never more than PREFETCH. Short tasks
are claimed in big batches (one statement for many); long ones are never hoarded."""


class Prefetch:
    def __init__(self, limit: int, window: float | None) -> None:
        self.limit = limit
        self.window = window  # None: always prefetch `limit`
        self.mean: float | None = None  # seconds, moving average of recent task durations

    def observe(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        self.mean = seconds if self.mean is None else self.mean * 0.9 + seconds * 0.1

    def size(self) -> int:
        if self.window is None:
            return self.limit
        if self.mean is None:
            return 0  # nothing known yet: claim only for free slots
        return min(self.limit, int(self.window / max(self.mean, 1e-6)))
