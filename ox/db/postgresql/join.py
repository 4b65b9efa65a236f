"""The join of a batch of successes (ox.workflow.join.succeeded) as one statement: the edges
out of the tasks closed with their results, their followers locked in id order and counted
down, the ones counted to 0 made READY, and a NOTIFY for their queues if a worker is marked
idle. Elsewhere that is three to five statements; on the completion's hot path each is a round
trip the worker waits for (bench cells workflow_chain_c1/c4)."""

import json
import uuid
from collections.abc import Mapping
from datetime import datetime

# Lock order: `locked` sorts before it locks (LockRows sits above the Sort), the order every
# other join takes (ox.workflow.join._lock): two workers ending members of the same groups
# cannot deadlock. `followed` updates rows `locked` holds: it reads their latest versions
# (a concurrent count-down that committed first is seen), as the SELECT ... FOR UPDATE then
# UPDATE of the other databases does.
SUCCEEDED = (
    "WITH v AS (SELECT * FROM jsonb_to_recordset(%s::jsonb) AS v(id uuid, r text)),"
    " edges AS (UPDATE ox_workflow_edge e SET result = v.r, done = true FROM v"
    " WHERE e.parent_id = v.id AND e.done = false RETURNING e.child_id),"
    " counts AS (SELECT child_id, count(*) AS n FROM edges GROUP BY child_id),"
    " locked AS (SELECT t.id, t.status, t.waiting, c.n FROM ox_task t JOIN counts c ON c.child_id = t.id"
    " ORDER BY t.id FOR UPDATE OF t),"
    " followed AS (UPDATE ox_task t SET waiting = GREATEST(l.waiting - l.n, 0),"
    " status = CASE WHEN l.status = 'PENDING' AND l.waiting - l.n <= 0 THEN 'READY' ELSE t.status END,"
    " run_after = CASE WHEN l.status = 'PENDING' AND l.waiting - l.n <= 0 THEN %s ELSE t.run_after END"
    " FROM locked l WHERE t.id = l.id"
    " RETURNING t.queue, l.status = 'PENDING' AND t.status = 'READY' AS became)"
    " SELECT q.queue, q.n, (SELECT pg_notify(%s, q.queue) FROM ox_worker"
    " WHERE idle_since IS NOT NULL AND stopped_at IS NULL LIMIT 1) IS NOT NULL"
    " FROM (SELECT queue, count(*) AS n FROM followed WHERE became GROUP BY queue) q"
)


# The same join as CTEs of complete_and_claim's statement (ox.db.postgresql.claim), reading the
# completion's CTE `done` (its RETURNING: the rows it wrote, not the fenced-out): a chain's
# step then costs its worker one round trip, completion, join and next claim together.
# Followers READY or RUNNING are left out: in one statement the completion and the claim update
# rows too (RUNNING ones, READY ones), and a row updated twice in one statement keeps one of
# the two updates, which one not defined. What such a follower misses is a count-down of
# `waiting`, which is read only while a task is PENDING (a workflow retry counts it again from
# the edges); its status, run_after and edges are as the generic path leaves them.
IN_CLAIM = (
    "jv AS (SELECT * FROM jsonb_to_recordset(%s::jsonb) AS v(id uuid, r text)),"
    " edges AS (UPDATE ox_workflow_edge e SET result = jv.r, done = true FROM jv JOIN done d ON d.id = jv.id"
    " WHERE e.parent_id = jv.id AND e.done = false RETURNING e.child_id),"
    " counts AS (SELECT child_id, count(*) AS n FROM edges GROUP BY child_id),"
    " locked AS (SELECT t.id, t.status, t.waiting, c.n FROM ox_task t JOIN counts c ON c.child_id = t.id"
    " WHERE t.status NOT IN ('READY', 'RUNNING') ORDER BY t.id FOR UPDATE OF t),"
    " followed AS (UPDATE ox_task t SET waiting = GREATEST(l.waiting - l.n, 0),"
    " status = CASE WHEN l.status = 'PENDING' AND l.waiting - l.n <= 0 THEN 'READY' ELSE t.status END,"
    " run_after = CASE WHEN l.status = 'PENDING' AND l.waiting - l.n <= 0 THEN %s ELSE t.run_after END"
    " FROM locked l WHERE t.id = l.id"
    " RETURNING t.queue, l.status = 'PENDING' AND t.status = 'READY' AS became),"
    " woken AS (SELECT q.queue, (SELECT pg_notify(%s, q.queue) FROM ox_worker"
    " WHERE idle_since IS NOT NULL AND stopped_at IS NULL LIMIT 1) IS NOT NULL AS sent"
    " FROM (SELECT DISTINCT queue FROM followed WHERE became) q)"
)


def succeeded_params(results: Mapping[uuid.UUID, str], now: datetime, channel: str) -> list[object]:
    """results: task id -> its return value's JSON text (copied onto its edges as it is)."""
    rows = [{"id": str(i), "r": text} for i, text in results.items()]
    return [json.dumps(rows), now, channel]
