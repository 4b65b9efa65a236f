"""Unique tasks on MySQL and MariaDB, which have no partial indexes: ox_task_unique (0013)
is written nowhere there, so the key a row holds is a generated column instead, NULL when the
row does not hold its key (NULLs never collide in a unique index), and the unique index is
on it. A status change moves the row in or out by itself, as the partial index does
elsewhere. Nothing on other databases."""

from django.db import migrations

from ox.db.base import UNIQUE_HELD

COLUMN = "unique_held"


def create(apps, schema_editor):
    if schema_editor.connection.features.supports_partial_indexes:
        return
    schema_editor.execute(
        f"ALTER TABLE ox_task ADD COLUMN {COLUMN} varchar(64)"
        f" GENERATED ALWAYS AS (CASE WHEN {UNIQUE_HELD} THEN unique_key END) STORED,"
        f" ADD UNIQUE INDEX ox_task_unique ({COLUMN})"
    )


def drop(apps, schema_editor):
    if schema_editor.connection.features.supports_partial_indexes:
        return
    schema_editor.execute(f"ALTER TABLE ox_task DROP INDEX ox_task_unique, DROP COLUMN {COLUMN}")


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot roll DDL back: Django refuses it inside a transaction

    dependencies = [
        ("ox", "0015_slots"),
    ]

    operations = [migrations.RunPython(create, drop, elidable=False)]
