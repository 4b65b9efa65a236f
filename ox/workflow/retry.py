"""Retry the failed part of a workflow: the tasks that failed or were cancelled, and every task
after them (whatever became of it: under "continue" it ran with None for the failure), run
again; what succeeded before them keeps its result. One transaction, the workflow's row locked
first, so two retries of one workflow take turns."""

import uuid
from collections import defaultdict
from typing import Any

from django.db import connections, router, transaction
from django.db.models import F

from ox import clock
from ox.archive import move_back
from ox.models import ArchivedTask, Status, Task
from ox.workflow.models import Edge, Workflow


class StillRunning(ValueError):
    """A task the retry would reset is running: retry once it ends."""


def retry_failed_part(workflow_id: Any) -> int:
    """Returns how many tasks were reset (0: nothing failed)."""
    from ox.operations import _budget

    db = router.db_for_write(Task)
    conn = connections[db]
    now = clock.db_now(conn)
    with transaction.atomic(using=db):
        flow = Workflow.objects.using(db).select_for_update().get(pk=workflow_id)
        archived = list(ArchivedTask.objects.using(db).filter(workflow_id=flow.id).values_list("pk", flat=True))
        if archived:
            move_back(conn, archived)
        rows = {}
        handlers = set()
        for pk, status, path, enqueued_at in (
            Task.objects.using(db)
            .filter(workflow_id=flow.id)
            .order_by("pk")
            .select_for_update()
            .values_list("pk", "status", "task_path", "enqueued_at")
        ):
            rows[pk] = (status, path)
            # The workflow's own tasks were enqueued with it; an on-failure task later, at a
            # failure. handler_id names only the latest (a retry clears it): an earlier one
            # that failed itself was taken for part of the workflow and run again.
            if enqueued_at != flow.created_at:
                handlers.add(pk)
        edges = list(Edge.objects.using(db).filter(workflow_id=flow.id).values_list("parent_id", "child_id", "done"))
        after: dict[uuid.UUID, list[uuid.UUID]] = defaultdict(list)
        into: dict[uuid.UUID, list[tuple[uuid.UUID, bool]]] = defaultdict(list)
        for parent, child, done in edges:
            after[parent].append(child)
            into[child].append((parent, done))
        failed = [
            pk
            for pk, (status, _p) in rows.items()
            if status in (Status.FAILED, Status.CANCELLED) and pk != flow.handler_id and pk not in handlers
        ]
        redo = _with_followers(failed, after)
        running = [pk for pk in redo if rows.get(pk, ("", ""))[0] == Status.RUNNING]
        if running:
            raise StillRunning(f"{len(running)} task(s) after the failure are running: retry once they end")
        if not redo:
            return 0
        Edge.objects.using(db).filter(workflow_id=flow.id, parent_id__in=redo).update(done=False, result=None)
        groups: dict[tuple[str, int, str], list[uuid.UUID]] = defaultdict(list)
        for pk in redo:
            if pk not in rows:
                continue  # pruned: nothing to run again
            waiting = sum(1 for parent, done in into[pk] if parent in redo or not done)
            status = Status.PENDING if waiting else Status.READY
            groups[(status, waiting, rows[pk][1])].append(pk)
        for (status, waiting, path), ids in groups.items():
            Task.objects.using(db).filter(pk__in=ids).update(
                status=status,
                waiting=waiting,
                run_after=now,
                finished_at=None,
                return_value=None,
                cancel_requested=False,
                lease_expires_at=None,
                max_attempts=F("attempts") + _budget(path),
            )
        # A new failure may enqueue the on-failure task again.
        Workflow.objects.using(db).filter(pk=flow.id).update(failed_at=None, handler_id=None)
    return sum(len(ids) for ids in groups.values())


def _with_followers(start: list[uuid.UUID], after: dict[uuid.UUID, list[uuid.UUID]]) -> set[uuid.UUID]:
    seen = set(start)
    todo = list(start)
    while todo:
        for child in after.get(todo.pop(), []):
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return seen
