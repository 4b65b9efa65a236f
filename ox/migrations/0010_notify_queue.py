"""PostgreSQL: the enqueue notification names the queue, and can be turned off.

One notification per queue an INSERT (or COPY) wrote to, its payload the queue's name, read
from the statement's transition table: a worker's listener wakes the worker only for its own
queues, so producers of one queue no longer make workers of every other queue claim for
nothing. `SET ox.notify = off` (per session, role or database: `ALTER ROLE ... SET ox.notify
= off`) stops the notifications of that session's enqueues; workers then find their tasks by
polling (POLL_INTERVAL). The channel is still ox_task, so a worker of an older release keeps
waking (for every queue) during a rolling upgrade.
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION ox_task_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('ox.notify', true) = 'off' THEN
        RETURN NULL;
    END IF;
    PERFORM pg_notify('ox_task', q.queue) FROM (SELECT DISTINCT queue FROM ox_task_inserted) AS q;
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS ox_task_notify ON ox_task;
CREATE TRIGGER ox_task_notify AFTER INSERT ON ox_task
    REFERENCING NEW TABLE AS ox_task_inserted
    FOR EACH STATEMENT EXECUTE FUNCTION ox_task_notify();
"""
# Back to 0005's trigger: one notification per statement, no payload.
RESTORE = """
CREATE OR REPLACE FUNCTION ox_task_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('ox_task', '');
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS ox_task_notify ON ox_task;
CREATE TRIGGER ox_task_notify AFTER INSERT ON ox_task
    FOR EACH STATEMENT EXECUTE FUNCTION ox_task_notify();
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def restore(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(RESTORE)


class Migration(migrations.Migration):
    dependencies = [("ox", "0009_ready_path_and_failed_indexes")]

    operations = [migrations.RunPython(create, restore, elidable=False)]
