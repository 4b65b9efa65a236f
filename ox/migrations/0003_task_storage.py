"""PostgreSQL storage parameters that suit a queue table (no-op on other databases).

ox_task rows are updated several times each (claim, lease renewals, completion) and deleted
by pruning: leave room on each page so a new row version can stay on its page (HOT when no
indexed column changes), and let autovacuum visit the table after a small fraction of it
has turned over instead of the default 20%.
"""

from django.db import migrations

TASK_STORAGE = {
    "fillfactor": "80",
    "autovacuum_vacuum_scale_factor": "0.02",
    "autovacuum_vacuum_insert_scale_factor": "0.02",
    "autovacuum_analyze_scale_factor": "0.02",
    "autovacuum_vacuum_cost_delay": "1",
}


def set_storage(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    options = ", ".join(f"{name} = {value}" for name, value in TASK_STORAGE.items())
    schema_editor.execute(f"ALTER TABLE ox_task SET ({options})")


def reset_storage(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f"ALTER TABLE ox_task RESET ({', '.join(TASK_STORAGE)})")


class Migration(migrations.Migration):
    dependencies = [
        ("ox", "0002_tick"),
    ]

    operations = [
        migrations.RunPython(set_storage, reset_storage, elidable=False),
    ]
