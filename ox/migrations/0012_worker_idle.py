"""PostgreSQL: the enqueue notification goes out only when a worker of the queue may be waiting.

NOTIFY at commit serializes committing transactions on a cluster-wide lock held until the
commit record is flushed (so notifying commits lose group commit): measured with 16 concurrent
producers, enqueue ran at 0.61-0.87x of its speed without notifications. Yet a worker that is
busy needs no wake-up: it claims again as soon as a slot frees. So a worker marks its ox_worker
row (idle_since) when it is about to wait with free slots and nothing left to claim, and clears
it once it has been busy for a heartbeat; the trigger notifies a queue only if a running worker
of that queue is marked. A producer that checked just before a worker's mark and commits just
after that worker's last look is seen by the worker's look again IDLE_RELOOK later, and at
worst at its next poll (ox.worker).

A marked worker whose heartbeat is over 2 minutes old is taken for dead (killed while it
waited: nothing cleared its mark). A producer in a REPEATABLE READ or SERIALIZABLE transaction
reads ox_worker as of its snapshot, which may predate a mark: it always notifies.

`SET ox.notify = always` (session, role or database) notifies at every enqueue as 0010 did,
e.g. while workers of an older release, which never mark themselves, still run; `off` never.
"""

from django.db import migrations, models

from ox.db.indexes import PartialIndex

CREATE = """
CREATE OR REPLACE FUNCTION ox_task_notify() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    mode text := current_setting('ox.notify', true);
BEGIN
    IF mode = 'off' THEN
        RETURN NULL;
    END IF;
    IF mode = 'always' OR current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM pg_notify('ox_task', q.queue) FROM (SELECT DISTINCT queue FROM ox_task_inserted) AS q;
        RETURN NULL;
    END IF;
    -- A statement of its own, so (READ COMMITTED) it sees every mark committed before it.
    PERFORM pg_notify('ox_task', q.queue) FROM (SELECT DISTINCT queue FROM ox_task_inserted) AS q
    WHERE EXISTS (
        SELECT 1 FROM ox_worker w
        WHERE w.idle_since IS NOT NULL AND w.stopped_at IS NULL AND w.queues @> to_jsonb(q.queue)
          AND w.heartbeat_at > statement_timestamp() - interval '120 seconds'
    );
    RETURN NULL;
END $$;
"""
# Back to 0010's function (the trigger itself is unchanged).
RESTORE = """
CREATE OR REPLACE FUNCTION ox_task_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('ox.notify', true) = 'off' THEN
        RETURN NULL;
    END IF;
    PERFORM pg_notify('ox_task', q.queue) FROM (SELECT DISTINCT queue FROM ox_task_inserted) AS q;
    RETURN NULL;
END $$;
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def restore(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(RESTORE)


class Migration(migrations.Migration):
    dependencies = [("ox", "0011_task_archive")]

    operations = [
        migrations.AddField(
            model_name="worker",
            name="idle_since",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="worker",
            index=PartialIndex(
                condition=models.Q(("idle_since__isnull", False), ("stopped_at__isnull", True)),
                fields=["idle_since"],
                name="ox_worker_idle",
                fallback=["stopped_at", "idle_since"],
            ),
        ),
        migrations.RunPython(create, restore, elidable=False),
    ]
