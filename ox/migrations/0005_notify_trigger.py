"""PostgreSQL: wake idle workers when tasks are enqueued (no-op on other databases).

A statement-level trigger costs no extra round trip: the NOTIFY rides on the producer's own
INSERT and is delivered at its commit (never for a rolled-back enqueue); a bulk INSERT
notifies once. Workers LISTEN on the channel ox.sql.NOTIFY_CHANNEL.
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION ox_task_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('ox_task', '');
    RETURN NULL;
END $$;
CREATE TRIGGER ox_task_notify AFTER INSERT ON ox_task
    FOR EACH STATEMENT EXECUTE FUNCTION ox_task_notify();
"""
DROP = """
DROP TRIGGER IF EXISTS ox_task_notify ON ox_task;
DROP FUNCTION IF EXISTS ox_task_notify();
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("ox", "0004_dashboard_indexes")]

    operations = [migrations.RunPython(create, drop, elidable=False)]
