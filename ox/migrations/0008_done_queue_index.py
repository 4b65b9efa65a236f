"""ox_task_done_queue: (queue, id) over finished rows, for the task list and the admin filtered
by queue (READY and RUNNING rows are in the claim and lease indexes already).

Also moves 0004's two partial indexes into the model state: 0004 created them with plain SQL,
so SQLite's table rebuild in 0007 dropped them without a word; declared in Meta.indexes, a
future rebuild recreates them.
- ox_task_done_path is created again where missing (IF NOT EXISTS: nothing happens on
  PostgreSQL, which kept it).
- ox_task_failed_queue becomes (status, queue, id): the task list of failed or cancelled tasks
  of a queue, newest first, reads the newest 50 entries instead of every match then a sort, and
  "retry all N matching" counts still read it alone. (Its finished_at column served nothing the
  (status, finished_at) index does not.)

Built CONCURRENTLY on PostgreSQL, so upgrading a large table does not hold enqueues and
completions back while the index builds (hence atomic = False).
"""

from django.db import migrations, models

from ox.db.indexes import PartialIndex

FINISHED = ["SUCCESSFUL", "FAILED", "CANCELLED"]
NEW = "ox_task_done_queue"
NEW_DEFINITION = "ox_task (queue, id) WHERE status IN ('SUCCESSFUL', 'FAILED', 'CANCELLED')"
DONE_PATH = "ox_task (task_path, id) WHERE status IN ('SUCCESSFUL', 'FAILED', 'CANCELLED')"
FAILED_QUEUE = "ox_task (status, queue, {last}) WHERE status IN ('FAILED', 'CANCELLED')"


STATE = [
    migrations.AddIndex(
        model_name="task",
        index=PartialIndex(
            condition=models.Q(("status__in", FINISHED)), fields=["task_path", "id"], name="ox_task_done_path"
        ),
    ),
    migrations.AddIndex(
        model_name="task",
        index=PartialIndex(
            condition=models.Q(("status__in", ["FAILED", "CANCELLED"])),
            fields=["status", "queue", "id"],
            name="ox_task_failed_queue",
        ),
    ),
    migrations.AddIndex(
        model_name="task",
        index=PartialIndex(condition=models.Q(("status__in", FINISHED)), fields=["queue", "id"], name=NEW),
    ),
]


def _concurrently(schema_editor) -> str:
    # Not inside a transaction (a caller's atomic(), a test's), where PostgreSQL refuses it.
    connection = schema_editor.connection
    return "CONCURRENTLY " if connection.vendor == "postgresql" and not connection.in_atomic_block else ""


def _failed_queue(schema_editor, last: str) -> None:
    concurrently = _concurrently(schema_editor)
    schema_editor.execute(f"DROP INDEX {concurrently}IF EXISTS ox_task_failed_queue")
    schema_editor.execute(f"CREATE INDEX {concurrently}ox_task_failed_queue ON {FAILED_QUEUE.format(last=last)}")


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
    concurrently = _concurrently(schema_editor)
    schema_editor.execute(f"CREATE INDEX {concurrently}IF NOT EXISTS {NEW} ON {NEW_DEFINITION}")
    schema_editor.execute(f"CREATE INDEX {concurrently}IF NOT EXISTS ox_task_done_path ON {DONE_PATH}")
    _failed_queue(schema_editor, "id")


def drop(apps, schema_editor):
    if _without_partial_indexes(apps, schema_editor, forwards=False):
        return
    # Back to 0004's indexes, as 0004 made them.
    schema_editor.execute(f"DROP INDEX {_concurrently(schema_editor)}IF EXISTS {NEW}")
    _failed_queue(schema_editor, "finished_at")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("ox", "0007_claim_kind_and_liveness"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(create, drop)],
            state_operations=STATE,
        ),
    ]
