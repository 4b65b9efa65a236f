"""Two partial indexes for the dashboard and the admin at scale (1M READY, 10M finished):

- ox_task_ready_path (task_path, id) over READY rows: the task list and the admin search by
  task path read READY rows through it, as finished ones through ox_task_done_path. Without it,
  a path that matches nothing reads every READY row's heap tuple (the claim index has no path):
  750 ms over a backlog of a million. It costs an enqueue (and a retry) one more index entry;
  a claim writes none (the claimed row is RUNNING, outside the predicate).
- ox_task_failed_status (status, id) over FAILED and CANCELLED rows: the list of failed (or
  cancelled) tasks, newest first, reads its newest 50 entries; without it, PostgreSQL walks
  the primary key backwards through the whole READY backlog (the newest ids) to find them.
  Only a failure or a cancel writes it.

Built CONCURRENTLY on PostgreSQL, so upgrading a large table does not hold enqueues and
completions back while the indexes build (hence atomic = False).
"""

from django.db import migrations, models

from ox.db.indexes import PartialIndex

INDEXES = {
    "ox_task_ready_path": "ox_task (task_path, id) WHERE status = 'READY'",
    "ox_task_failed_status": "ox_task (status, id) WHERE status IN ('FAILED', 'CANCELLED')",
}


STATE = [
    migrations.AddIndex(
        model_name="task",
        index=PartialIndex(
            condition=models.Q(("status", "READY")), fields=["task_path", "id"], name="ox_task_ready_path"
        ),
    ),
    migrations.AddIndex(
        model_name="task",
        index=PartialIndex(
            condition=models.Q(("status__in", ["FAILED", "CANCELLED"])),
            fields=["status", "id"],
            name="ox_task_failed_status",
        ),
    ),
]


def _concurrently(schema_editor) -> str:
    # Not inside a transaction (a caller's atomic(), a test's), where PostgreSQL refuses it.
    connection = schema_editor.connection
    return "CONCURRENTLY " if connection.vendor == "postgresql" and not connection.in_atomic_block else ""


def _without_partial_indexes(apps, schema_editor, forwards: bool) -> bool:
    """MySQL, MariaDB: the indexes as PartialIndex makes them there (full, led by status)."""
    if schema_editor.connection.features.supports_partial_indexes:
        return False
    task = apps.get_model("ox", "Task")
    for operation in STATE:
        (schema_editor.add_index if forwards else schema_editor.remove_index)(task, operation.index)
    return True


def create(apps, schema_editor):
    if _without_partial_indexes(apps, schema_editor, forwards=True):
        return
    for name, definition in INDEXES.items():
        schema_editor.execute(f"CREATE INDEX {_concurrently(schema_editor)}IF NOT EXISTS {name} ON {definition}")


def drop(apps, schema_editor):
    if _without_partial_indexes(apps, schema_editor, forwards=False):
        return
    for name in INDEXES:
        schema_editor.execute(f"DROP INDEX {_concurrently(schema_editor)}IF EXISTS {name}")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("ox", "0008_done_queue_index"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(create, drop)],
            state_operations=STATE,
        )
    ]
