"""What a running task writes about itself, the same statements on every database: its
metadata (ox.metadata) and its durable steps' results (ox.steps). Each write names the
attempt (the task's id and fence) and a RUNNING row, so an attempt whose lease was taken, or
a task that has finished, writes nothing."""

import uuid
from datetime import datetime
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

# A task that saves has started: the write says so too, as the heartbeat would a moment later
# (through Django's API a claimed task reads READY until its start is written).
_SAVE_METADATA = (
    "UPDATE ox_task SET metadata = %s, started_at = COALESCE(started_at, %s),"
    " last_attempted_at = COALESCE(last_attempted_at, %s) WHERE id = %s AND fence = %s AND status = 'RUNNING'"
)
_RECORD_STEP = (
    "INSERT INTO ox_step (task_id, name, result, attempt, started_at, finished_at)"
    " SELECT id, %s, %s, %s, %s, %s FROM ox_task WHERE id = %s AND fence = %s AND status = 'RUNNING'"
)


class TaskNotes:
    """A part of every driver (ox.db.base.Driver), whose dialect gives `id` and `ts`."""

    id: Any
    ts: Any

    def save_metadata(
        self, conn: BaseDatabaseWrapper, task_id: uuid.UUID, fence: int, text: str, started: datetime | None
    ) -> bool:
        """Write a task's metadata (JSON text); False: the attempt no longer holds it."""
        at = self.ts(conn, started)
        with conn.cursor() as cursor:
            cursor.execute(_SAVE_METADATA, [text, at, at, self.id(task_id), fence])
            return cursor.rowcount == 1

    def recorded_steps(self, conn: BaseDatabaseWrapper, task_id: uuid.UUID) -> list[tuple[str, Any]]:
        """(name, stored result) of every step the task has recorded."""
        with conn.cursor() as cursor:
            cursor.execute("SELECT name, result FROM ox_step WHERE task_id = %s", [self.id(task_id)])
            return list(cursor.fetchall())

    def record_step(
        self,
        conn: BaseDatabaseWrapper,
        task_id: uuid.UUID,
        fence: int,
        name: str,
        text: str,
        attempt: int,
        started: datetime,
        finished: datetime,
    ) -> bool:
        """Record a step's result (JSON text); False: the attempt no longer holds the task.
        (A name recorded already raises the database's IntegrityError.)"""
        params = [name, text, attempt, self.ts(conn, started), self.ts(conn, finished), self.id(task_id), fence]
        with conn.cursor() as cursor:
            cursor.execute(_RECORD_STEP, params)
            return cursor.rowcount == 1
