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

import time
import uuid
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from ox import sql
from ox.db import driver
from ox.flow.decide import CONCURRENCY, KEY_RATE, KEYS, PAUSED, RATE, Candidate, Decision, Gated
from ox.flow.keywalk import free_key_heads, keyless_heads
from ox.flow.limits import QueueLimits

__all__ = ["CONCURRENCY", "KEYS", "KEY_RATE", "PAUSED", "RATE", "Gated", "claim_limited", "prune_key_rates"]

# READY tasks read per kind: a window past the wanted ones, so that tasks of full keys at the
# head do not hide others. A few wanted: WINDOW_PER_TASK each, WINDOW_MIN at least. Many (a
# prefetching claim, or a worker of many threads): WINDOW_MIN past twice as many, since each
# candidate read costs the claim Python work too and a window passed over in full is read
# again longer anyway. WINDOW_MAX at most; past it ox.flow.keywalk finds other keys' tasks.
WINDOW_PER_TASK = 8
WINDOW_MIN = 64
WINDOW_MAX = 1000

_CANDIDATE = "id, queue, is_async, limit_key, priority, run_after"


def _lock(conn: BaseDatabaseWrapper, names: list[str]) -> dict[str, tuple[bool, float | None]]:
    """Make sure each queue has its row, lock the rows in name order; name -> (paused, rate_tat)."""
    _ensure_rows(conn, names)
    with conn.cursor() as cursor:
        where = ", ".join(["%s"] * len(names))
        lock = driver(conn).for_update
        cursor.execute(
            f"SELECT name, paused, rate_tat FROM ox_queue WHERE name IN ({where}) ORDER BY name{lock}", names
        )
        return {name: (bool(paused), tat) for name, paused, tat in cursor.fetchall()}


def _ensure_rows(conn: BaseDatabaseWrapper, names: list[str]) -> None:
    d = driver(conn)
    marks = ", ".join([f"(%s, {d.false}, '{{}}', {d.false}, '')"] * len(names))
    with conn.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO ox_queue (name, paused, overrides, limited, updated_by) VALUES {marks}"
            + d.skip_duplicate("name"),
            names,
        )


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


def _candidates(conn: BaseDatabaseWrapper, names: list[str], flag: int, now: datetime, window: int) -> list[Candidate]:
    """Due READY tasks of one kind in claim order (priority, then due time, then id)."""
    rows = driver(conn).ready_rows(conn, names, flag, now, window, _CANDIDATE)
    return sorted((Candidate.of(r) for r in rows), key=lambda c: c.order)


def _key_rates(conn: BaseDatabaseWrapper, pairs: set[tuple[str, str]]) -> dict[tuple[str, str], float]:
    if not pairs:
        return {}
    out: dict[tuple[str, str], float] = {}
    by_queue: dict[str, list[str]] = {}
    for queue, key in pairs:
        by_queue.setdefault(queue, []).append(key)
    with conn.cursor() as cursor:
        for queue, keys in by_queue.items():
            for start in range(0, len(keys), 500):
                chunk = keys[start : start + 500]
                marks = ", ".join(["%s"] * len(chunk))
                cursor.execute(
                    f"SELECT r.key, r.tat FROM ox_key_rate r WHERE r.queue = %s AND r.key IN ({marks})",
                    [queue, *chunk],
                )
                out.update({(queue, k): tat for k, tat in cursor.fetchall()})
    return out


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
    async) tasks from the queues `limits` names (a queue with no limits is claimed as such),
    in one transaction. Returns the completions written and what the gate gave."""
    names = sorted(limits)
    if not names or max(demand) <= 0:
        return (sql.complete(conn, done) if done else set()), Gated()
    fast = driver(conn).gate_in_round_trips(conn)
    if fast is not None:
        if any(c.workflow for c in done):
            # A workflow task's end joins in the transaction that records it (sql.complete);
            # the round trips below write completions without the join. Written first, on
            # their own: their slots count as free all the same.
            written = sql.complete(conn, done)
            _none, gated = _claim_fast(conn, fast, worker_id, limits, names, demand, now, lease_expires_at, ())
            return written, gated
        return _claim_fast(conn, fast, worker_id, limits, names, demand, now, lease_expires_at, done)
    return _claim_locked(conn, worker_id, limits, names, demand, now, lease_expires_at, done)


@sql.again_on_deadlock
def _claim_locked(
    conn: BaseDatabaseWrapper,
    worker_id: str,
    limits: dict[str, QueueLimits],
    names: list[str],
    demand: tuple[int, int],
    now: datetime,
    lease_expires_at: datetime,
    done: Sequence[sql.Completion],
) -> tuple[set[tuple[uuid.UUID, int]], Gated]:
    """The gate's claim in one transaction (run again whole if it is a deadlock victim)."""
    # The count after the lock must see what the last holder committed, whatever the
    # database's default isolation (a REPEATABLE READ snapshot predates the lock).
    with driver(conn).transaction(conn, read_committed=True):
        written = sql.complete(conn, done) if done else set()
        states = _lock(conn, names)
        open_names = [n for n in names if not states.get(n, (False, None))[0]]
        if not open_names:
            return written, Gated()
        decision = Decision(
            limits, {q: tat for q, (_p, tat) in states.items()}, _running(conn, open_names), now.timestamp()
        )
        _offer(conn, decision, open_names, demand, now, None)
        out = decision.outcome()
        if decision.taken:
            out.claimed = _set_running(conn, worker_id, decision.taken, lease_expires_at)
        _save_rates(conn, decision)
        return written, out


def _window(want: int) -> int:
    return min(max(WINDOW_MIN, WINDOW_PER_TASK * want), WINDOW_MIN + 2 * want, WINDOW_MAX)


@sql.again_on_deadlock
def _claim_fast(
    conn: BaseDatabaseWrapper,
    gate_pg: Any,
    worker_id: str,
    limits: dict[str, QueueLimits],
    names: list[str],
    demand: tuple[int, int],
    now: datetime,
    lease: datetime,
    done: Sequence[sql.Completion],
    retried: bool = False,
) -> tuple[set[tuple[uuid.UUID, int]], Gated]:
    """The same steps in two round trips (PostgreSQL: ox.db.postgresql.gate), in one transaction
    rolled back whole on any error (so run again whole if it is a deadlock victim)."""
    windows = _windows(limits, names, demand)
    try:
        written, states, running, reads = gate_pg.lock_and_read(conn, names, windows, now, done)
        if len(states) < len(names):
            # A queue without its row has nothing to lock: make the rows, then start again.
            gate_pg.rollback(conn)
            if retried:
                raise RuntimeError(f"ox_queue rows missing for {sorted(set(names) - set(states))}")
            _ensure_rows(conn, names)
            return _claim_fast(conn, gate_pg, worker_id, limits, names, demand, now, lease, done, retried=True)
        open_names = [n for n in names if not states[n][0]]
        decision = Decision(limits, {q: tat for q, (_p, tat) in states.items()}, running, now.timestamp())
        if open_names:
            # (A paused queue's window is empty: the read skips paused queues.)
            _offer(conn, decision, open_names, demand, now, (reads, windows))
        out = decision.outcome()
        out.claimed = gate_pg.finish(
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
    return written, out


Windows = dict[tuple[str, int], int]  # (queue, kind) -> candidates to read


def _windows(limits: dict[str, QueueLimits], names: list[str], demand: tuple[int, int]) -> Windows:
    """Per queue and kind, how many due tasks to read. A queue with key limits is read for
    both kinds even when one has no room: a key's older task of that kind then holds back
    its newer ones of the other (order within a key)."""
    out: Windows = {}
    for queue in names:
        for flag in (0, 1):
            if demand[flag] > 0:
                out[(queue, flag)] = _window(demand[flag])
            elif limits[queue].keyed:
                out[(queue, flag)] = WINDOW_MIN
    return out


def _offer(
    conn: BaseDatabaseWrapper,
    decision: Decision,
    names: list[str],
    demand: tuple[int, int],
    now: datetime,
    first: tuple[dict[tuple[str, int], list[Candidate]], Windows] | None,
) -> None:
    """Offer the due tasks of every queue and kind merged in claim order, each kind up to its
    demand. Where key limits passed over every task of a queue's window and there may be
    more, read that window again four times as long (up to WINDOW_MAX), then walk the
    queue's other keys (ox.flow.keywalk): tasks of full keys at the head of a queue never
    hide the others, and what a claim reads stays bounded. `first`: the windows PostgreSQL
    read with the lock, and their sizes."""
    got = [0, 0]
    seen: set[object] = set()
    if first is not None:
        reads, windows = first
    else:
        windows = _windows(decision.limits, names, demand)
        reads = {k: _candidates(conn, [k[0]], k[1], now, w) for k, w in windows.items()}
    while True:
        _offer_sorted(conn, decision, [c for cs in reads.values() for c in cs], demand, got, seen)
        if got[0] >= demand[0] and got[1] >= demand[1]:
            return
        hidden = [k for k, cs in reads.items() if len(cs) >= windows[k] and decision.held_by_keys(k[0])]
        if not hidden:
            return
        longer = {k: min(windows[k] * 4, WINDOW_MAX) for k in hidden if windows[k] < WINDOW_MAX}
        if not longer:
            for queue in sorted({q for q, _f in hidden}):
                _walk_keys(conn, decision, queue, demand, now, got, seen)
            return
        windows.update(longer)
        reads = {k: _candidates(conn, [k[0]], k[1], now, w) for k, w in longer.items()}


def _offer_sorted(
    conn: BaseDatabaseWrapper,
    decision: Decision,
    candidates: list[Candidate],
    demand: tuple[int, int],
    got: list[int],
    seen: set[object],
) -> None:
    candidates = sorted((c for c in candidates if c.id not in seen), key=lambda c: c.order)
    pairs = {(c.queue, c.limit_key) for c in candidates if c.limit_key is not None}
    pairs = {p for p in pairs if decision.limits[p[0]].key_rate is not None and p not in decision.key_tats}
    decision.key_tats.update(_key_rates(conn, pairs))
    for c in candidates:
        seen.add(c.id)
        pair = (c.queue, c.limit_key) if c.limit_key is not None else None
        if pair is not None and pair in decision.passed:
            continue  # an earlier task of its key waits: so does this one
        flag = int(c.is_async)
        if got[flag] < demand[flag] and decision.offer(c):
            got[flag] += 1
        elif pair is not None:
            decision.passed.add(pair)


def _walk_keys(
    conn: BaseDatabaseWrapper,
    decision: Decision,
    queue: str,
    demand: tuple[int, int],
    now: datetime,
    got: list[int],
    seen: set[object],
) -> None:
    """Past WINDOW_MAX: the first due tasks of the keys not full (nor passed over in this
    claim), and the first tasks without a key, offered in claim order."""
    lim = decision.limits[queue]
    full = {
        k
        for (q, k), n in decision.per_key.items()
        if q == queue and lim.key_concurrency is not None and n >= lim.key_concurrency
    }
    skip = full | {k for q, k in decision.passed if q == queue}
    heads = free_key_heads(conn, queue, now, skip)
    for flag in (0, 1):
        left = demand[flag] - got[flag]
        if left > 0:
            heads += keyless_heads(conn, queue, now, flag, left)
    _offer_sorted(conn, decision, heads, demand, got, seen)


def _set_running(conn: BaseDatabaseWrapper, worker_id: str, ids: list[object], lease: datetime) -> list[sql.Claimed]:
    return driver(conn).set_running(conn, worker_id, ids, lease)


def _save_rates(conn: BaseDatabaseWrapper, d: Decision) -> None:
    upsert = driver(conn).upsert(("queue", "key"), ("tat",))
    key_column = conn.ops.quote_name("key")  # a reserved word on MySQL
    with conn.cursor() as cursor:
        for queue in sorted(d.rate_changed):
            cursor.execute("UPDATE ox_queue SET rate_tat = %s WHERE name = %s", [d.tats[queue], queue])
        for queue, key in sorted(d.key_changed):
            cursor.execute(
                f"INSERT INTO ox_key_rate (queue, {key_column}, tat) VALUES (%s, %s, %s){upsert}",
                [queue, key, d.key_tats[(queue, key)]],
            )


def prune_key_rates(conn: BaseDatabaseWrapper, now: float | None = None) -> int:
    """Drop per-key rate rows whose schedule is in the past: an absent row allows a start
    now, exactly as such a row does."""
    with conn.cursor() as cursor:
        cursor.execute("DELETE FROM ox_key_rate WHERE tat < %s", [time.time() if now is None else now])
        return cursor.rowcount
