"""The gate: claiming from queues with concurrency or rate limits, exactly, across every
worker and host.

A limited claim is one transaction that first locks the queues' ox_queue rows (in name
order, so two gates never deadlock; on SQLite the IMMEDIATE transaction is the lock), then
counts what runs (the RUNNING rows themselves, through ox_task_running_queue: nothing to
keep in step, so a task that finishes, fails, times out, is rescued or handed back frees its
slot the moment its status changes), reads the first due READY tasks in claim order, takes
those the limits allow, and commits. Limited claims of one queue are one at a time; the lock
is held for a few statements. A READY task whose key is full is passed over, and the tasks
after it of other keys are taken: within a key, claim order holds.

Rates are GCRA schedules (ox.flow.limits): the queue's in ox_queue.rate_tat, each key's in
ox_key_rate. A claim held back by a rate says when the next start is allowed, and the worker
sleeps until then instead of polling.
"""

import json
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from django.db.backends.base.base import BaseDatabaseWrapper

from ox import sql
from ox.flow import gate_pg
from ox.flow.limits import QueueLimits, next_start, take

# READY tasks read per queue and kind, per wanted task: a window past the first ones, so
# that tasks of full keys at the head do not hide others (WINDOW_MIN at least, WINDOW_MAX at
# most: beyond it, tasks behind that many of full keys wait for those keys).
WINDOW_PER_TASK = 8
WINDOW_MIN = 64
WINDOW_MAX = 1000

# Why a queue gave fewer tasks than asked (the dashboard and the worker's wake-up read it).
PAUSED, CONCURRENCY, KEYS, RATE, KEY_RATE = "paused", "concurrency", "key concurrency", "rate", "key rate"


@dataclass
class Gated:
    claimed: list[sql.Claimed] = field(default_factory=list)
    # queue -> why it could give no more (only queues with due tasks left behind)
    blocked: dict[str, str] = field(default_factory=dict)
    # epoch seconds: the earliest a rate limit allows the next start of a queue held back by one
    wake_at: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class _Candidate:
    id: object  # as the database returns it
    queue: str
    is_async: bool
    limit_key: str | None


def _lock(conn: BaseDatabaseWrapper, names: list[str]) -> dict[str, tuple[bool, float | None]]:
    """Make sure each queue has its row, lock the rows in name order; name -> (paused, rate_tat)."""
    _ensure_rows(conn, names)
    with conn.cursor() as cursor:
        where = ", ".join(["%s"] * len(names))
        lock = " FOR UPDATE" if sql.is_postgres(conn) else ""
        cursor.execute(
            f"SELECT name, paused, rate_tat FROM ox_queue WHERE name IN ({where}) ORDER BY name{lock}", names
        )
        return {name: (bool(paused), tat) for name, paused, tat in cursor.fetchall()}


def _running(conn: BaseDatabaseWrapper, names: list[str]) -> tuple[Counter[str], Counter[tuple[str, str]]]:
    """RUNNING tasks per queue and per (queue, limit key)."""
    where = ", ".join(["%s"] * len(names))
    with conn.cursor() as cursor:
        cursor.execute(
            "SELECT queue, limit_key, count(*) FROM ox_task"
            f" WHERE status = 'RUNNING' AND queue IN ({where}) GROUP BY queue, limit_key",
            names,
        )
        rows = cursor.fetchall()
    per_queue: Counter[str] = Counter()
    per_key: Counter[tuple[str, str]] = Counter()
    for queue, key, count in rows:
        per_queue[queue] += count
        if key is not None:
            per_key[(queue, key)] += count
    return per_queue, per_key


def _candidates(conn: BaseDatabaseWrapper, names: list[str], flag: int, now: datetime, window: int) -> list[_Candidate]:
    """Due READY tasks of one kind in claim order (priority, then due time, then id)."""
    if sql.is_postgres(conn):
        columns = "c.id, c.queue, c.limit_key"
        query, params = sql.candidates_sql(
            "true" if flag else "false", names, now, window, window, columns=columns, gate=True
        )
        with conn.cursor() as cursor:
            cursor.execute(query, params)
            return [_Candidate(r[0], r[1], bool(flag), r[2]) for r in cursor.fetchall()]
    levels = sql._sqlite_levels(conn, names, gate=True)
    ids = sql._sqlite_pick(conn, flag, names, levels, sql._ts(conn, now), window)
    if not ids:
        return []
    with conn.cursor() as cursor:
        cursor.execute(
            "SELECT id, queue, limit_key FROM ox_task WHERE id IN (SELECT value FROM json_each(%s))",
            [json.dumps(ids)],
        )
        found = {r[0]: (r[1], r[2]) for r in cursor.fetchall()}
    return [_Candidate(i, found[i][0], bool(flag), found[i][1]) for i in ids if i in found]


def _key_rates(conn: BaseDatabaseWrapper, pairs: set[tuple[str, str]]) -> dict[tuple[str, str], float]:
    if not pairs:
        return {}
    out: dict[tuple[str, str], float] = {}
    with conn.cursor() as cursor:
        by_queue: dict[str, list[str]] = {}
        for queue, key in pairs:
            by_queue.setdefault(queue, []).append(key)
        for queue, keys in by_queue.items():
            for start in range(0, len(keys), 500):
                chunk = keys[start : start + 500]
                marks = ", ".join(["%s"] * len(chunk))
                cursor.execute(
                    f"SELECT key, tat FROM ox_key_rate WHERE queue = %s AND key IN ({marks})", [queue, *chunk]
                )
                out.update({(queue, k): tat for k, tat in cursor.fetchall()})
    return out


class _Decision:
    """Walks candidates in claim order and takes what every limit allows."""

    def __init__(
        self,
        limits: dict[str, QueueLimits],
        states: dict[str, tuple[bool, float | None]],
        running: tuple[Counter[str], Counter[tuple[str, str]]],
        key_tats: dict[tuple[str, str], float],
        now: float,
    ) -> None:
        self.limits, self.now = limits, now
        self.running, self.per_key = running
        self.tats = {q: tat for q, (_paused, tat) in states.items()}
        self.key_tats = dict(key_tats)
        self.out = Gated()
        self.taken: list[object] = []
        self.rate_changed: set[str] = set()
        self.key_changed: set[tuple[str, str]] = set()

    def _hold(self, queue: str, why: str, wake: float | None = None) -> None:
        self.out.blocked.setdefault(queue, why)
        if wake is not None:
            self.out.wake_at[queue] = min(wake, self.out.wake_at.get(queue, wake))

    def offer(self, c: _Candidate) -> bool:
        lim = self.limits[c.queue]
        if lim.concurrency is not None and self.running[c.queue] >= lim.concurrency:
            self._hold(c.queue, CONCURRENCY)
            return False
        pair = (c.queue, c.limit_key) if c.limit_key is not None else None
        if pair is not None and lim.key_concurrency is not None and self.per_key[pair] >= lim.key_concurrency:
            self._hold(c.queue, KEYS)
            return False
        new_tat = new_key_tat = None
        if lim.rate is not None:
            new_tat = take(self.tats.get(c.queue), self.now, lim.rate)
            if new_tat is None:
                self._hold(c.queue, RATE, next_start(self.tats.get(c.queue), self.now, lim.rate))
                return False
        if pair is not None and lim.key_rate is not None:
            new_key_tat = take(self.key_tats.get(pair), self.now, lim.key_rate)
            if new_key_tat is None:
                self._hold(c.queue, KEY_RATE, next_start(self.key_tats.get(pair), self.now, lim.key_rate))
                return False
        if new_tat is not None:
            self.tats[c.queue] = new_tat
            self.rate_changed.add(c.queue)
        if new_key_tat is not None and pair is not None:
            self.key_tats[pair] = new_key_tat
            self.key_changed.add(pair)
        self.running[c.queue] += 1
        if pair is not None:
            self.per_key[pair] += 1
        self.taken.append(c.id)
        return True


def claim_limited(
    conn: BaseDatabaseWrapper,
    worker_id: str,
    limits: dict[str, QueueLimits],
    demand: tuple[int, int],
    now: datetime,
    lease_expires_at: datetime,
    done: Sequence[sql.Completion] = (),
) -> tuple[set[tuple[uuid.UUID, int]], Gated]:
    """Write finished tasks (so their slots count as free), then claim up to `demand` (sync,
    async) tasks from the limited queues `limits` names, in one transaction. Returns the
    completions written and what the gate gave."""
    names = sorted(limits)
    if not names or max(demand) <= 0:
        return (sql.complete(conn, done) if done else set()), Gated()
    if sql.is_postgres(conn) and gate_pg.usable(conn):
        return _claim_pg(conn, worker_id, limits, names, demand, now, lease_expires_at, done)
    with sql.transaction(conn):
        written = sql.complete(conn, done) if done else set()
        states = _lock(conn, names)
        open_names = [n for n in names if not states.get(n, (False, None))[0]]
        if not open_names:
            return written, Gated()
        decision = _Decision(limits, states, _running(conn, open_names), {}, now.timestamp())
        for flag, want in enumerate(demand):
            if want > 0:
                _offer_kind(conn, decision, limits, open_names, flag, want, now)
        if decision.taken:
            decision.out.claimed = _set_running(conn, worker_id, decision.taken, lease_expires_at)
        _save_rates(conn, decision)
        return written, decision.out


def _window(want: int) -> int:
    return min(max(WINDOW_MIN, WINDOW_PER_TASK * want), WINDOW_MAX)


def _claim_pg(
    conn: BaseDatabaseWrapper,
    worker_id: str,
    limits: dict[str, QueueLimits],
    names: list[str],
    demand: tuple[int, int],
    now: datetime,
    lease: datetime,
    done: Sequence[sql.Completion],
    retried: bool = False,
) -> tuple[set[tuple[uuid.UUID, int]], Gated]:
    """PostgreSQL: the same steps in two round trips (ox.flow.gate_pg)."""
    windows = (_window(demand[0]), _window(demand[1]))
    try:
        written, states, running, kinds = gate_pg.lock_and_read(conn, names, demand, windows, now, done)
        if len(states) < len(names):
            # A queue without its row has nothing to lock: make the rows, then start again.
            gate_pg.rollback(conn)
            if retried:
                raise RuntimeError(f"ox_queue rows missing for {sorted(set(names) - set(states))}")
            _ensure_rows(conn, names)
            return _claim_pg(conn, worker_id, limits, names, demand, now, lease, done, retried=True)
        open_names = [n for n in names if not states[n][0]]
        decision = _Decision(limits, states, running, {}, now.timestamp())
        for flag, want in enumerate(demand):
            if want > 0 and open_names:
                first = [_Candidate(i, q, bool(flag), k) for i, q, k in kinds[flag] if q in open_names]
                _offer_kind(conn, decision, limits, open_names, flag, want, now, (first, windows[flag]))
        decision.out.claimed = gate_pg.finish(
            conn,
            worker_id,
            decision.taken,
            lease,
            {q: decision.tats[q] for q in decision.rate_changed},
            {p: decision.key_tats[p] for p in decision.key_changed},
        )
    except BaseException:
        try:
            gate_pg.rollback(conn)
        except Exception:  # noqa: BLE001, S110  (the connection is gone: the worker reconnects)
            pass
        raise
    return written, decision.out


def _ensure_rows(conn: BaseDatabaseWrapper, names: list[str]) -> None:
    false = "false" if sql.is_postgres(conn) else "0"
    marks = ", ".join([f"(%s, {false}, '{{}}', {false}, '')"] * len(names))
    with conn.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO ox_queue (name, paused, overrides, limited, updated_by) VALUES {marks}"
            " ON CONFLICT (name) DO NOTHING",
            names,
        )


def _offer_kind(
    conn: BaseDatabaseWrapper,
    decision: "_Decision",
    limits: dict[str, QueueLimits],
    names: list[str],
    flag: int,
    want: int,
    now: datetime,
    first: tuple[list["_Candidate"], int] | None = None,
) -> None:
    """Offer the due tasks of one kind in claim order until `want` are taken. When a key
    limit passes over every task read and there may be more, read again a window four times
    as long (up to WINDOW_MAX): tasks of full keys at the head of a queue do not hide the
    others behind them, and what a claim reads stays bounded. `first`: candidates already
    read (PostgreSQL reads them with the lock), and the window they were read with."""
    window = _window(want)
    seen: set[object] = set()
    got = 0
    while True:
        if first is not None:
            candidates, window = first
            first = None
        else:
            candidates = _candidates(conn, names, flag, now, window)
        fresh = [c for c in candidates if c.id not in seen]
        pairs = {(c.queue, c.limit_key) for c in fresh if c.limit_key is not None}
        pairs = {p for p in pairs if limits[p[0]].key_rate is not None and p not in decision.key_tats}
        decision.key_tats.update(_key_rates(conn, pairs))
        for c in fresh:
            if got >= want:
                return
            seen.add(c.id)
            got += decision.offer(c)
        keys_held = any(why in (KEYS, KEY_RATE) for why in decision.out.blocked.values())
        if got >= want or len(candidates) < window or window >= WINDOW_MAX or not keys_held:
            return
        window = min(window * 4, WINDOW_MAX)


def _set_running(conn: BaseDatabaseWrapper, worker_id: str, ids: list[object], lease: datetime) -> list[sql.Claimed]:
    with conn.cursor() as cursor:
        if sql.is_postgres(conn):
            cursor.execute(
                f"{sql._SET_RUNNING} WHERE id = ANY(%s) AND status = 'READY' RETURNING {sql.CLAIM_COLUMNS}",
                [worker_id, lease, ids],
            )
        else:
            cursor.execute(
                f"{sql._SET_RUNNING} WHERE id IN (SELECT value FROM json_each(%s)) AND status = 'READY'"
                f" RETURNING {sql.CLAIM_COLUMNS}",
                [worker_id, sql._ts(conn, lease), json.dumps(ids)],
            )
        return sql._read_claimed(cursor.fetchall())


def _save_rates(conn: BaseDatabaseWrapper, d: _Decision) -> None:
    with conn.cursor() as cursor:
        for queue in sorted(d.rate_changed):
            cursor.execute("UPDATE ox_queue SET rate_tat = %s WHERE name = %s", [d.tats[queue], queue])
        for queue, key in sorted(d.key_changed):
            cursor.execute(
                "INSERT INTO ox_key_rate (queue, key, tat) VALUES (%s, %s, %s)"
                " ON CONFLICT (queue, key) DO UPDATE SET tat = excluded.tat",
                [queue, key, d.key_tats[(queue, key)]],
            )


def prune_key_rates(conn: BaseDatabaseWrapper, now: float | None = None) -> int:
    """Drop per-key rate rows whose schedule is in the past: an absent row allows a start
    now, exactly as such a row does."""
    with conn.cursor() as cursor:
        cursor.execute("DELETE FROM ox_key_rate WHERE tat < %s", [time.time() if now is None else now])
        return cursor.rowcount
