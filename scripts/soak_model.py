"""The soak's settings and what it records: per window, and for the whole run (scripts/soak.py)."""

from dataclasses import dataclass, field


@dataclass
class SoakConfig:
    minutes: float = 1.0
    window: float | None = None  # seconds per window; None: 5 s for short runs, minutes*2 s for long
    rate: float | None = None  # tasks/s from all producers; None: load x measured capacity
    load: float = 0.5
    # Burst capacity is measured on a fresh table, drained in the biggest claims there are, with
    # nothing else enqueuing: it overstates what a churning table sustains beside a producer on 2
    # cores (here: bursts of 5,700-13,000/s; 3,669/s fell behind within 2 minutes once the table
    # had bloated). So the rate is also capped, by default at 1,500/s: about half of the
    # drain_c1 benchmark (README: 3,174 tasks/s on PostgreSQL).
    max_rate: float = 1500.0
    concurrency: int = 2  # per worker process
    workers: int = 1
    producers: int = 1
    prune_successful: float = 5.0  # OPTIONS PRUNE {"SUCCESSFUL": seconds}
    prune_interval: float = 1.0  # OPTIONS PRUNE_INTERVAL
    # OPTIONS ARCHIVE_AFTER, seconds; None: ox's default (5 minutes: with SUCCESSFUL pruned after
    # 5 s nothing reaches the archive). Shorter than prune_successful: rows go through both.
    archive_after: float | None = None
    warmup_windows: int = 1  # windows before the table can be in its steady state; not compared
    drain_timeout: float = 120.0  # after the producers stop, everything must finish within this
    # Diagnostic, off by default: a plain VACUUM of ox_task after each window's sample, standing
    # in for an autovacuum the server does not run (it changes nothing in the server's config).
    vacuum_each_window: bool = False
    # tests.settings turns DEBUG on, and under DEBUG Django keeps each connection's last 9,000
    # statements with their parameters (connection.queries_log): a worker's claim and completion
    # statements carry hundreds of ids, so its RSS climbs by ~80 MiB over ~10 minutes before
    # the log is full. That is Django's debug cache, not the worker: by default the workers run
    # with DEBUG off (see run_worker); debug=True keeps it on, to measure exactly that.
    debug: bool = False

    def window_seconds(self) -> float:
        if self.window is not None:
            return self.window
        # 5 s windows for a short run (12 per minute: enough to take medians of thirds); a long
        # run gets 30 windows, so one window spans several autovacuum naptimes (60 s default).
        return max(5.0, self.minutes * 60 / 30)

    def ox_options(self) -> dict[str, object]:
        options: dict[str, object] = {
            "PRUNE": {"SUCCESSFUL": self.prune_successful},
            "PRUNE_INTERVAL": self.prune_interval,
        }
        if self.archive_after is not None:
            options["ARCHIVE_AFTER"] = self.archive_after
        return options


@dataclass
class Window:
    index: int
    seconds: float  # since the producers started
    enqueued: int  # in this window
    drained: int  # finished in this window (enqueued - backlog delta)
    rate: float  # drained per second
    pending: int  # READY + RUNNING at the window's end
    dead: int | None  # PostgreSQL n_dead_tup; SQLite freelist pages
    table_bytes: int  # heap (PostgreSQL) / ox_task's b-tree pages (SQLite)
    index_bytes: int  # every index of ox_task
    ready_index_bytes: int | None  # ox_task_ready_claim
    archive_bytes: int | None  # ox_task_archive with its indexes (None: no such table)
    file_bytes: int | None  # SQLite: page_count * page_size
    wal_bytes: int | None  # SQLite: the -wal file
    vacuums: int | None  # PostgreSQL: autovacuum_count + vacuum_count so far
    rss_kib: int  # sum over the worker processes
    cpu_ms_per_task: float | None  # worker CPU (user + system) per drained task


@dataclass
class SoakResult:
    vendor: str
    config: SoakConfig
    capacity: float | None  # tasks/s drained from a burst, before the soak
    rate: float  # target enqueue rate
    windows: list[Window] = field(default_factory=list)
    enqueued_total: int = 0
    statuses: dict[str, int] = field(default_factory=dict)  # rows left at the end
    pruned_logged: int = 0  # sum of the workers' "pruned N finished tasks" lines
    attempt_rows: int = 0  # ox_attempt rows left: a failed or lost attempt would leave one
    retried: int = 0  # tasks with attempts > 1
    drain_seconds: float | None = None  # producers stopped -> nothing READY or RUNNING
    worker_exit_codes: list[int | None] = field(default_factory=list)
    autovacuum: str | None = None  # the server's setting (PostgreSQL)

    @property
    def unaccounted(self) -> int:
        """Enqueued tasks neither present (in any status) nor deleted by the pruner. The pruner
        deletes SUCCESSFUL rows only (PRUNE has no other status), so a row it took had
        succeeded. 0 when nothing was lost."""
        return self.enqueued_total - sum(self.statuses.values()) - self.pruned_logged
