"""Arm "celery" (PyPI celery 5.7.0 on Redis; pinned in bench/requirements-celery.txt, its agent and
workers run in bench/.venv-celery). The queue is a Redis list (kombu's Redis transport), enqueues
are `task.delay()` (a Redis publish: **not** part of any database transaction), the workers are
`celery -A bench.celery_app worker --pool prefork --concurrency C` (Celery's default pool: a main
process and C forked pool processes, one task at a time each), and this class reads progress from
Celery's result backend (Redis too) and the ledger.

Where the counts come from (never from inside a task): the worker writes a task's result record
(`celery-task-meta-<id>`: status SUCCESS / FAILURE, date_done on the worker's clock) after the
task returns, and acknowledges the message after that (acks_late). Done = SUCCESS records; the
drain's span runs from the first pool process's first task start (bench.celery_tasks) to the last
date_done. Waiting messages are the list `celery`; delivered but unacknowledged ones sit in the
hash `unacked` until acknowledged, or until kombu restores them once they are older than the
transport's visibility_timeout (3,600 s by default), or when their worker shuts down warm.

The backlog (`fill`) is published the ordinary way, `apply_async()` per task, but under a key
prefix no worker reads (kombu's `global_keyprefix` transport option: the message bodies and
routing are those of a plain send, only the Redis key differs), and moved onto the live list
`celery` by one Redis script when the caller's transaction commits. Published straight to
`celery`, a 10,000-task fill took seconds (18 s in the run below) while the idle workers drained
it as it arrived; the drain job starts the span at its commit at the earliest
(`max(first, committed_at)`), so the tasks run during the fill fell out of the span but not out
of N (run 20261204T074529Z, drain_c4 repetition 2: 10,000 tasks over the 0.233 s after the commit,
"42,895/s", where the first start to the last date_done was 18.3 s).
"""

import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

from django.db import connection, transaction
from django.tasks import Task

from bench import procs
from bench.arms.base import Arm, Calls

META = "celery-task-meta-"
QUEUE, UNACKED = "celery", "unacked"
# Where the fill publishes (kombu prefixes every key of that connection): the workers BRPOP on
# `celery` only, so nothing here is theirs until RELEASE moves it.
STAGE = "bench:fill:"
# One script, so atomic: a worker's BRPOP sees none of the backlog or all of it (Redis serves
# blocked clients after the script). RENAME when the live list is absent (O(1), the drain's
# case: the workers are idle on an empty queue); otherwise RPOPLPUSH one by one, which appends
# the staged messages oldest first behind whatever is already waiting, as LPUSHes would have.
RELEASE = """
local n = redis.call('LLEN', KEYS[1])
if n == 0 then return 0 end
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('RENAME', KEYS[1], KEYS[2])
else
  for _ = 1, n do redis.call('RPOPLPUSH', KEYS[1], KEYS[2]) end
end
return n
"""

# fill_fast's copies: ARGV = the template message, its task id, its delivery tag, the first copy's
# number, how many. Each copy is the template with both uuids' last 12 hex digits replaced by the
# copy's number (the uuids' dashes escaped for Lua's patterns), LPUSHed behind it.
COPY = """
local msg, tid, tag = ARGV[1], ARGV[2], ARGV[3]
local first, n = tonumber(ARGV[4]), tonumber(ARGV[5])
local tid_pat, tag_pat = tid:gsub('%-', '%%-'), tag:gsub('%-', '%%-')
local tid_head, tag_head = tid:sub(1, 24), tag:sub(1, 24)
local batch = {}
for i = first, first + n - 1 do
  local suffix = string.format('%012x', i)
  local copy = msg:gsub(tid_pat, tid_head .. suffix):gsub(tag_pat, tag_head .. suffix)
  batch[#batch + 1] = copy
  if #batch == 1000 then redis.call('LPUSH', KEYS[1], unpack(batch)); batch = {} end
end
if #batch > 0 then redis.call('LPUSH', KEYS[1], unpack(batch)) end
return redis.call('LLEN', KEYS[1])
"""
COPY_CHUNK = 50_000  # copies per script call: Redis serves nobody else while one runs


def redis_client() -> Any:
    """The arm's Redis database (settings.REDIS_URL: db 5 unless BENCH_CELERY_REDIS_DB says otherwise)."""
    import redis
    from django.conf import settings

    return redis.Redis.from_url(settings.REDIS_URL)


class CeleryArm(Arm):
    name = "celery"
    launcher = "celery"  # `python -m celery ...` on the celery venv's interpreter
    bulk_path = "group(...).apply_async(): one publish per task (Celery has no bulk send)"
    done_status = "SUCCESS"
    terminal_statuses = ("SUCCESS", "FAILURE")
    job_overrides = {
        "enqueue_seq": "bench.celery_jobs:enqueue_seq",
        "dispatch": "bench.celery_jobs:dispatch",
        "bulk": "bench.celery_jobs:bulk",
    }
    producer_hook = "bench.celery_jobs:producer"  # the enqueue_p* cells' producers (bench.producer)

    def __init__(self) -> None:
        self.ids: dict[int, str] = {}  # ledger key -> Celery task id (the fills of this agent)
        self.trees: dict[str, set[int]] = {}  # ident -> the worker's main pid and pool pids seen
        # time.time() just before the backlog went live (RELEASE): no task of it can start earlier.
        self.released_at: float | None = None

    @cached_property
    def redis(self) -> Any:
        # On first use, not at import: the module then imports without redis-py (the project's
        # test venv has none), and the pure helpers below can be tested there.
        return redis_client()

    # ---- workers
    def worker_argv(self, concurrency: int, ident: str, interval: float | None, queue: str = "default") -> list[str]:
        # queue: Celery's default queue ("celery"). --pool prefork is the default, named for the record.
        return [
            "-A",
            "bench.celery_app",
            "worker",
            "--pool",
            "prefork",
            # concurrency 0 (drain_defaults): no flag, Celery's default (one process per CPU).
            *(["--concurrency", str(concurrency)] if concurrency else []),
            "--hostname",
            f"{ident}@%h",
            "--loglevel",
            "WARNING",
        ]

    def running_on(self, ident: str, pid: int) -> list[int]:
        """Keys whose latest execution started in this worker's process tree and has no result
        yet. Celery keeps no "running on" record in Redis, so the ledger (which pool process
        started each task) stands in for it; the tree is remembered for after the kill."""
        tree = self.trees.setdefault(ident, set())
        if os.path.exists(f"/proc/{pid}"):
            tree |= {pid} | procs.descendants(pid)
        with connection.cursor() as cursor:
            cursor.execute("SELECT task_key, pid, t FROM bench_ledger ORDER BY t")
            latest: dict[int, int] = {}
            for key, run_pid, _t in cursor.fetchall():
                latest[key] = run_pid
        keys = [key for key, run_pid in latest.items() if run_pid in tree]
        if not keys:
            return []
        metas = self.redis.mget([META + self.ids.get(key, "?") for key in keys])
        return [key for key, meta in zip(keys, metas, strict=True) if meta is None]

    def ready(self, pids: Sequence[int]) -> bool | None:
        return None  # the harness waits for the workers to go idle (after mingle's boot exchange)

    # ---- enqueue
    def bulk_enqueue(self, task: Task, calls: Calls) -> None:
        from bench.celery_tasks import BY_NAME

        celery_task = BY_NAME[task.func.__name__]
        for args, kwargs in calls:
            sent = celery_task.apply_async(args=list(args), kwargs=dict(kwargs))
            if args:
                self.ids[args[0]] = sent.id

    def fill(self, task: Task, calls: Calls) -> None:
        """One publish per task (Celery has no bulk send), staged under STAGE, and made live in
        one step when the caller's transaction commits (Arm.fill's contract: the backlog appears
        to the workers all at once). Sent straight to the live list, the workers drained it while
        it was being sent, and the drain job, which starts the span at the commit at the earliest,
        divided N by the tail alone (see the module's docstring)."""
        from bench.celery_app import app
        from bench.celery_tasks import BY_NAME

        celery_task = BY_NAME[task.func.__name__]
        with app.connection_for_write(transport_options={"global_keyprefix": STAGE}) as conn:
            producer = app.amqp.Producer(conn)
            for args, kwargs in calls:
                sent = celery_task.apply_async(args=list(args), kwargs=dict(kwargs), producer=producer)
                if args:
                    self.ids[args[0]] = sent.id
        self.release_on_commit(len(calls))

    def release_on_commit(self, expected: int, on_commit: Callable[[Callable[[], None]], None] | None = None) -> None:
        """Check that every message of the fill is staged (none went to the live list: the
        prefix applies to every key kombu writes), then release them at the commit.
        `on_commit`: transaction.on_commit unless a test passes its own."""
        staged = int(self.redis.llen(STAGE + QUEUE))
        if staged != expected:
            raise RuntimeError(f"{staged} messages staged in {STAGE + QUEUE!r}, {expected} sent")
        (on_commit or transaction.on_commit)(self.release)

    def release(self) -> None:
        """Move the staged backlog onto the live list (one atomic script), then drop the rest of
        the staging keys (kombu's binding records for the prefixed connection)."""
        # Taken before the script runs: every task start of this backlog is later.
        self.released_at = time.time()
        self.redis.eval(RELEASE, 2, STAGE + QUEUE, QUEUE)
        leftovers = list(self.redis.scan_iter(match=STAGE + "*", count=1000))
        if leftovers:
            self.redis.delete(*leftovers)

    def fill_fast(self, task: Task, total: int) -> None:
        """The backlog cells' fill, as Arm.fill_fast does it for the database arms: one message
        published the ordinary way (staged, as `fill` does), then copied total-1 times inside Redis
        by one script per chunk (COPY), each copy with its own task id and kombu delivery tag (the
        template's with the last 12 hex digits replaced by the copy's number: a shared id would
        share one result record, a shared tag one `unacked` entry). Released at the commit, as
        `fill` is."""
        if self.redis.llen(STAGE + QUEUE) or self.redis.llen(QUEUE):
            raise RuntimeError("fill_fast needs an empty queue (reset first)")
        from bench.celery_app import app
        from bench.celery_tasks import BY_NAME

        celery_task = BY_NAME[task.func.__name__]
        with app.connection_for_write(transport_options={"global_keyprefix": STAGE}) as conn:
            celery_task.apply_async(producer=app.amqp.Producer(conn))
        raw = self.redis.lindex(STAGE + QUEUE, 0)
        message = json.loads(raw)
        task_id, tag = message["headers"]["id"], message["properties"]["delivery_tag"]
        for start in range(1, total, COPY_CHUNK):
            count = min(COPY_CHUNK, total - start)
            self.redis.eval(COPY, 1, STAGE + QUEUE, raw, task_id, tag, start, count)
        self.release_on_commit(total)

    # ---- reading progress
    def _metas(self) -> list[dict[str, Any]]:
        keys = list(self.redis.scan_iter(match=META + "*", count=1000))
        out = []
        for start in range(0, len(keys), 1000):
            out += [json.loads(raw) for raw in self.redis.mget(keys[start : start + 1000]) if raw]
        return out

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for meta in self._metas():
            counts[meta["status"]] = counts.get(meta["status"], 0) + 1
        counts["queued"] = int(self.redis.llen(QUEUE))
        counts["unacked"] = int(self.redis.hlen(UNACKED))
        return {k: v for k, v in counts.items() if v}

    def done(self) -> int:
        return sum(1 for meta in self._metas() if meta["status"] == "SUCCESS")

    def span(self) -> tuple[datetime | None, datetime | None]:
        from bench.celery_tasks import FIRST_START_KEY

        starts = [float(v) for v in self.redis.hvals(FIRST_START_KEY)]
        return span_of(starts, self._metas(), self.released_at)

    def first_n(self, n: int) -> tuple[datetime | None, datetime | None, int]:
        """span()'s first start and checks, with the n-th earliest SUCCESS date_done (fewer done:
        the last, and their number)."""
        from bench.celery_tasks import FIRST_START_KEY

        metas = self._metas()
        first, last = span_of([float(v) for v in self.redis.hvals(FIRST_START_KEY)], metas, self.released_at)
        ends = sorted(_utc(datetime.fromisoformat(m["date_done"])) for m in metas if m["status"] == "SUCCESS")
        if len(ends) >= n:
            return first, ends[n - 1], n
        return first, last, len(ends)

    def options(self) -> dict[str, Any]:
        from importlib import metadata

        from bench.celery_app import app

        conf = app.conf
        names = (
            "broker_url",
            "result_backend",
            "task_acks_late",
            "task_reject_on_worker_lost",
            "worker_prefetch_multiplier",
            "task_serializer",
            "result_expires",
            "broker_transport_options",
            "task_default_queue",
            "worker_pool",
        )
        server = self.redis.info("server")
        persistence = self.redis.info("persistence")
        return {
            "package": f"celery {metadata.version('celery')}, kombu {metadata.version('kombu')},"
            f" redis-py {metadata.version('redis')}",
            "conf": {name: str(conf.get(name)) for name in names},
            "visibility_timeout_s": 3600,
            "redis": {
                "version": server.get("redis_version"),
                "aof_enabled": persistence.get("aof_enabled"),
                "rdb_save": str(self.redis.config_get("save").get("save")),
            },
            "worker": "python -m celery -A bench.celery_app worker --pool prefork --concurrency C --hostname ID@%h",
        }

    # ---- housekeeping
    def reset(self, extra_tables: Sequence[str]) -> None:
        """Flush the arm's Redis database (only that one) and truncate the ledger."""
        self.redis.flushdb()
        self.ids.clear()
        self.trees.clear()
        self.released_at = None
        if extra_tables:
            with connection.cursor() as cursor:
                cursor.execute(f"TRUNCATE {', '.join(extra_tables)} RESTART IDENTITY")

    def analyze(self) -> None:
        return None  # nothing of Celery's is in the database


def _utc(at: datetime) -> datetime:
    # Celery 5.7 writes date_done aware (UTC, microseconds); a naive one (older Celery, or
    # enable_utc off) is taken as UTC, each record on its own, so max() never compares naive
    # with aware.
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


def span_of(
    starts: Iterable[float], metas: Iterable[dict[str, Any]], released_at: float | None
) -> tuple[datetime | None, datetime | None]:
    """The drain's span: the earliest pool process's first task start (time.time() stamps) to
    the latest SUCCESS date_done. Refuses a span that cannot be this backlog's: a start or a
    result earlier than its release (`released_at`) was a task run before the backlog went live
    (a fill leaking to the workers) or a record left from another run; measured anyway, the
    drain job would cut such a span at its commit and overstate the throughput."""
    starts = list(starts)
    ends = [_utc(datetime.fromisoformat(m["date_done"])) for m in metas if m["status"] == "SUCCESS"]
    first = datetime.fromtimestamp(min(starts), UTC) if starts else None
    last = max(ends) if ends else None
    if first is None and last is None:
        return None, None
    if released_at is None:
        raise RuntimeError("task starts or results, but this agent released no backlog")
    released = datetime.fromtimestamp(released_at, UTC)
    if first is not None and first < released:
        raise RuntimeError(f"a task started {(released - first).total_seconds():.3f} s before its backlog's release")
    if ends and min(ends) < released:
        raise RuntimeError(
            f"a result is dated {(released - min(ends)).total_seconds():.3f} s before its backlog's release"
        )
    return first, last


ARM = CeleryArm()
