"""Partial indexes for the operations dashboard, written only when a task finishes.

- ox_task_done_path (task_path, id) over finished rows: the task list filtered by task path,
  newest first, without walking the whole history when the path is rare.
- ox_task_failed_queue (status, queue, finished_at) over FAILED and CANCELLED rows: "failed in
  the last 24 h" per queue and "retry all N matching" counts read the index alone.

Both are partial, so claims and lease renewals (RUNNING rows) never touch them; a completion
adds one entry (two for a failure). Plain SQL that PostgreSQL and SQLite both accept; they are
not in ox.models' Meta.indexes, so the model state (and makemigrations) does not see them.
Where the database has no partial indexes (MySQL, MariaDB), nothing: 0008 makes their final
forms there.
"""

from django.db import migrations

INDEXES = {
    "ox_task_done_path": "ox_task (task_path, id) WHERE status IN ('SUCCESSFUL', 'FAILED', 'CANCELLED')",
    "ox_task_failed_queue": "ox_task (status, queue, finished_at) WHERE status IN ('FAILED', 'CANCELLED')",
}


def create(apps, schema_editor):
    if schema_editor.connection.features.supports_partial_indexes:
        for name, definition in INDEXES.items():
            schema_editor.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {definition}")


def drop(apps, schema_editor):
    if schema_editor.connection.features.supports_partial_indexes:
        for name in INDEXES:
            schema_editor.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [
        ("ox", "0003_task_storage"),
    ]

    operations = [migrations.RunPython(create, drop)]
