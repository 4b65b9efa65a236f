"""The walks over the READY index every driver's claim is built on: per queue and kind, the
priorities present, found by stepping from one to the next lower (one index probe each)
instead of reading the tasks, so what a claim or a wake-up costs does not grow with the
backlog. Written once, with the dialect's bits passed in."""

from collections.abc import Sequence

# gate: which queues limited at run time a claim may take from: all (True: ox.flow.gate),
# none (False), or the ones named (the slotted queues whose slots the worker holds).
Gate = bool | Sequence[str]

# Queues the claim for unlimited queues leaves alone: paused ones, and ones with limits set at
# run time (ox_queue.limited; ox.flow.gate claims from those). One primary key probe each.
_SKIP_QUEUE = "NOT EXISTS (SELECT 1 FROM ox_queue s WHERE s.name = l.queue AND (s.paused OR s.limited))"
_SKIP_PAUSED = "NOT EXISTS (SELECT 1 FROM ox_queue s WHERE s.name = l.queue AND s.paused)"

LEVEL_READY = "FROM ox_task t WHERE t.status = 'READY' AND t.queue = l.queue AND t.is_async = l.is_async"


def distinct(queues: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(queues))


def candidates_per_level(limit: int) -> int:
    """Unlocked candidates read per priority and queue: some beyond `limit`, so that a claim
    racing another for the same first rows still finds rows nobody holds."""
    return 2 * limit + 8


def skip(gate: Gate) -> tuple[str, list[object]]:
    """The condition (on l.queue) that leaves out the queues a claim must not take from."""
    if gate is True:
        return _SKIP_PAUSED, []
    if not gate:
        return _SKIP_QUEUE, []
    allowed = list(gate)
    marks = ", ".join(["%s"] * len(allowed))
    text = (
        "NOT EXISTS (SELECT 1 FROM ox_queue s WHERE s.name = l.queue"
        f" AND (s.paused OR (s.limited AND l.queue NOT IN ({marks}))))"
    )
    return text, allowed


def levels_cte(
    queues: Sequence[str], flags: Sequence[str], gate: Gate = False, text_type: str = "text"
) -> tuple[str, list[object]]:
    """`levels(queue, is_async, priority)`: per queue and kind, every priority of a READY task
    there. Rows with a NULL priority end each walk. Paused queues (and unless `gate`, queues
    limited at run time) are left out."""
    starts = " UNION ALL ".join(f"SELECT CAST(%s AS {text_type}), {flag}" for _q in queues for flag in flags)
    skip_text, skip_params = skip(gate)
    sql = (
        f"pairs(queue, is_async) AS ({starts}), levels(queue, is_async, priority) AS ("
        f"SELECT l.queue, l.is_async, (SELECT max(t.priority) {LEVEL_READY}) FROM pairs l WHERE {skip_text}"
        f" UNION ALL SELECT l.queue, l.is_async, (SELECT max(t.priority) {LEVEL_READY} AND t.priority < l.priority)"
        " FROM levels l WHERE l.priority IS NOT NULL)"
    )
    return sql, [*(q for q in queues for _flag in flags), *skip_params]
