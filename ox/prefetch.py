"""How many tasks to claim beyond the free slots: enough to keep the slots busy for about
PREFETCH_WINDOW seconds at the recent task duration, never more than PREFETCH. Short tasks
are claimed in big batches (one statement for many); long ones are never hoarded: a
prefetched task whose path is not known to be short goes straight back, and so do the
prefetched tasks waiting behind tasks that turn out long."""

MAX_PATHS = 1000  # task paths whose duration is remembered (an app has a few dozen)


class Prefetch:
    def __init__(self, limit: int, window: float | None) -> None:
        self.limit = limit
        self.window = window  # None: always prefetch `limit`, whatever the durations
        self.mean: float | None = None  # seconds, moving average of recent task durations
        self.by_path: dict[str, float] = {}  # the same, per task path

    def observe(self, path: str, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        self.mean = seconds if self.mean is None else self.mean * 0.9 + seconds * 0.1
        known = self.by_path.get(path)
        if known is None and len(self.by_path) >= MAX_PATHS:
            self.by_path.pop(next(iter(self.by_path)))
        self.by_path[path] = seconds if known is None else known * 0.7 + seconds * 0.3

    def running_long(self, path: str, seconds: float) -> None:
        """A task of `path` has been running `seconds` and is not done: at least that long."""
        self.by_path[path] = max(self.by_path.get(path, 0.0), seconds)

    def size(self) -> int:
        if self.window is None:
            return self.limit
        if self.mean is None:
            return 0  # nothing known yet: claim only for free slots
        return min(self.limit, int(self.window / max(self.mean, 1e-6)))

    def short(self, path: str) -> bool:
        """May a task of this path wait in the inbox behind others?"""
        if self.window is None:
            return True
        known = self.by_path.get(path)
        return known is not None and known <= self.window
