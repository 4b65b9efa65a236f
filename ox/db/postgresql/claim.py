"""PostgreSQL's claim as SQL: the walks over the READY index (ox.db.walks) with a range scan
per priority beside each step (LATERAL), the picks locked with SKIP LOCKED, and the claim's
UPDATE as parts complete_and_claim and the gate put beside other statements."""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from ox.db.base import SET_RUNNING
from ox.db.rows import CLAIM_COLUMNS, Completion
from ox.db.walks import Gate, candidates_per_level, distinct, skip

# A workflow task's inputs read by its claim (Claimed.inputs), one index probe of its edges
# (ox_edge_child) each: not a round trip of their own after the claim. Edges of a task not in a
# workflow are not looked for. A 2-D text array of [gather, result] pairs in position order.
INPUTS = (
    "CASE WHEN workflow_id IS NULL THEN NULL ELSE ARRAY(SELECT ARRAY[e.gather::text, e.result]"
    " FROM ox_workflow_edge e WHERE e.child_id = ox_task.id ORDER BY e.position) END AS inputs"
)


@dataclass(slots=True)
class ClaimSql:
    """A claim as parts, so complete_and_claim can put its picks beside the completion."""

    picks: list[str]  # CTEs choosing ids, one per kind asked for
    pick_params: list[object]
    update: str  # the UPDATE ... RETURNING, reading the picks
    update_params: list[object]


def candidates_sql(
    flag: str, queues: Sequence[str], now: object, k: int, limit: int, columns: str = "c.id", gate: Gate = False
) -> tuple[str, list[object]]:
    """Due READY tasks of one kind in these queues, in claim order, read without
    locks from the READY index: per queue a recursive query steps through the priorities
    present (one index probe each: max(priority) below the last), and for each priority a
    range scan of the due rows (run_after <= now) reads up to k. Stepping by priority is
    what keeps tasks scheduled for later at a higher priority from being read on every
    claim. gate: for ox.flow.gate (run-time limited queues included, paused ones not)."""
    ready = f"FROM ox_task t WHERE t.status = 'READY' AND t.queue = l.queue AND t.is_async = {flag}"
    starts = " UNION ALL ".join("SELECT CAST(%s AS text)" for _q in queues)
    skip_text, skip_params = skip(gate)
    sql = (
        "WITH RECURSIVE levels(queue, priority) AS ("
        f"SELECT l.queue, (SELECT max(t.priority) {ready}) FROM ({starts}) AS l(queue) WHERE {skip_text}"
        f" UNION ALL SELECT l.queue, (SELECT max(t.priority) {ready} AND t.priority < l.priority)"
        " FROM levels l WHERE l.priority IS NOT NULL"
        f") SELECT {columns} FROM levels l CROSS JOIN LATERAL ("
        f"SELECT t.id, t.run_after, t.queue, t.limit_key {ready} AND t.priority = l.priority AND t.run_after <= %s"
        f" ORDER BY t.run_after, t.id LIMIT {int(k)}) AS c"
        f" WHERE l.priority IS NOT NULL ORDER BY l.priority DESC, c.run_after, c.id LIMIT {int(limit)}"
    )
    # The limits are in the text, not parameters: the worker's claims are prepared with a
    # generic plan (ox.db.postgresql.prepared), and a generic plan's LIMIT $n is estimated at
    # a tenth of its input, here the backlog: a row count that turns the walk into scans.
    return sql, [*queues, *skip_params, now]


def pick_sql(flag: str, queues: Sequence[str], now: object, limit: int, gate: Gate = False) -> tuple[str, list[object]]:
    """The ids of up to `limit` due READY tasks of one kind in these queues, in
    claim order (candidates_sql), so that what a claim costs does not depend on how many
    tasks wait. Candidates are read without locks; only the best `limit` of them are locked,
    in claim order, skipping any another worker holds (SKIP LOCKED: workers never wait for
    each other, and a row taken meanwhile fails the status re-check). So a claim locks no
    more than it takes, and a concurrent claim is never kept from rows nobody will claim."""
    # The candidates' bound rounded up to a power of two: it is in the statement's text (see
    # candidates_sql), and the worker prepares each text it runs (ox.db.postgresql.prepared),
    # so a limit that moves with the prefetch estimate must not make a new statement each time.
    # What it takes stays exact: the last LIMIT is a parameter, its generic estimate bounded by
    # the candidates' literal one.
    k = 1 << (candidates_per_level(limit) - 1).bit_length()
    candidates, params = candidates_sql(flag, queues, now, k, k, gate=gate)
    sql = (
        f"SELECT w.id FROM ox_task w WHERE w.id IN ({candidates}) AND w.status = 'READY'"
        " ORDER BY w.priority DESC, w.run_after, w.id LIMIT %s FOR UPDATE SKIP LOCKED"
    )
    return sql, [*params, limit]


def claim_parts(
    worker_id: str,
    queues: Sequence[str],
    limits: tuple[int, int],
    now: datetime,
    lease_expires_at: datetime,
    gate: Gate = False,
) -> ClaimSql:
    """limits: how many sync and how many async tasks to claim. Each kind is
    picked by its own scans of the READY index (_pick_sql), so a worker never claims tasks
    of a kind it has no free slot for. started_at and last_attempted_at are left to the
    first write after the body starts: a claimed task that has not started reads as READY
    (ox.results)."""
    kinds = [(flag, limit) for flag, limit in zip(("false", "true"), limits, strict=True) if limit > 0]
    picks = [pick_sql(flag, distinct(queues), now, limit, gate) for flag, limit in kinds]
    ctes = [f"pick_{flag} AS ({pick})" for (flag, _limit), (pick, _params) in zip(kinds, picks, strict=True)]
    pick_params: list[object] = [p for _pick, params in picks for p in params]
    ids = " UNION ALL ".join(f"SELECT id FROM pick_{flag}" for flag, _limit in kinds)
    update = f"{SET_RUNNING} WHERE id IN ({ids}) RETURNING {CLAIM_COLUMNS}, {INPUTS}"
    return ClaimSql(ctes, pick_params, update, [worker_id, lease_expires_at])


def _metadata_member(d: Completion) -> str:
    # A completion with no metadata to write leaves the key out: md is NULL, the row's stays.
    return "" if d.metadata_json is None else f',"md":{d.metadata_json}'


def complete_sql(done: Sequence[Completion]) -> tuple[str, list[object]]:
    # One JSON document rather than arrays: building it is a string join, where adapting
    # arrays element by element costs the worker more CPU than the task.
    sql = (
        "UPDATE ox_task AS t SET status = 'SUCCESSFUL', return_value = v.rv,"
        " finished_at = v.at, lease_expires_at = NULL,"
        " started_at = COALESCE(t.started_at, v.st), last_attempted_at = v.st,"
        " metadata = COALESCE(v.md, t.metadata)"
        " FROM jsonb_to_recordset(%s::jsonb)"
        " AS v(id uuid, fence bigint, rv jsonb, st timestamptz, at timestamptz, md jsonb)"
        " WHERE t.id = v.id AND t.fence = v.fence AND t.status = 'RUNNING' RETURNING t.id, t.fence"
    )
    rows = ",".join(
        f'{{"id":"{d.id}","fence":{d.fence},"rv":{d.return_json},'
        f'"st":"{d.started_at.isoformat()}","at":"{d.finished_at.isoformat()}"{_metadata_member(d)}}}'
        for d in done
    )
    return sql, [f"[{rows}]"]
