"""The archive: finished tasks move out of ox_task into ox_task_archive (ox.archive), so the
hot table and its partial indexes stay at the size of the live backlog plus ARCHIVE_AFTER of
history. Attempts stay in ox_attempt whichever table holds their task, so their foreign key
is no longer a database constraint.

PostgreSQL (no-op elsewhere, reversible): the archive is append-mostly. Rows are inserted in
batches and only leave by pruning or a retry, never updated, so pages are packed full
(fillfactor 100, no room for new row versions) and autovacuum visits it after 2% of inserts
(the default waits for 20%): that sets the visibility map the dashboard's index-only counts
rely on, and freezes the rows before an anti-wraparound VACUUM of a huge table has to.
"""

import django.db.models.deletion
import ox.ids
from django.db import migrations, models

from ox.db.indexes import PartialIndex


ARCHIVE_STORAGE = {
    "fillfactor": "100",
    "autovacuum_vacuum_insert_scale_factor": "0.02",
    "autovacuum_vacuum_scale_factor": "0.05",
    "autovacuum_analyze_scale_factor": "0.02",
}


def set_storage(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    options = ", ".join(f"{name} = {value}" for name, value in ARCHIVE_STORAGE.items())
    schema_editor.execute(f"ALTER TABLE ox_task_archive SET ({options})")


def reset_storage(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f"ALTER TABLE ox_task_archive RESET ({', '.join(ARCHIVE_STORAGE)})")


class Migration(migrations.Migration):

    dependencies = [
        ('ox', '0010_notify_queue'),
    ]

    operations = [
        migrations.AlterField(
            model_name='attempt',
            name='task',
            field=models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.CASCADE, related_name='failed_attempts', to='ox.task'),
        ),
        migrations.CreateModel(
            name='ArchivedTask',
            fields=[
                ('id', models.UUIDField(default=ox.ids.uuid7, editable=False, primary_key=True, serialize=False)),
                ('task_path', models.CharField(max_length=255)),
                ('queue', models.CharField(default='default', max_length=64)),
                ('priority', models.SmallIntegerField(default=0)),
                ('status', models.CharField(choices=[('READY', 'Ready'), ('RUNNING', 'Running'), ('SUCCESSFUL', 'Successful'), ('FAILED', 'Failed'), ('CANCELLED', 'Cancelled')], default='READY', max_length=10)),
                ('args', models.JSONField(default=list)),
                ('kwargs', models.JSONField(default=dict)),
                ('run_after', models.DateTimeField()),
                ('scheduled_for', models.DateTimeField(blank=True, null=True)),
                ('is_async', models.BooleanField(db_default=False, default=False)),
                ('enqueued_at', models.DateTimeField()),
                ('started_at', models.DateTimeField(blank=True, null=True)),
                ('last_attempted_at', models.DateTimeField(blank=True, null=True)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('attempts', models.PositiveIntegerField(default=0)),
                ('max_attempts', models.PositiveIntegerField(default=1)),
                ('worker_id', models.CharField(blank=True, default='', max_length=128)),
                ('lease_expires_at', models.DateTimeField(blank=True, null=True)),
                ('fence', models.PositiveIntegerField(default=0)),
                ('return_value', models.JSONField(blank=True, null=True)),
                ('cancel_requested', models.BooleanField(default=False)),
            ],
            options={
                'verbose_name': 'archived task',
                'db_table': 'ox_task_archive',
                'indexes': [models.Index(fields=['status', 'finished_at'], name='ox_archive_status_finished'), models.Index(fields=['queue', 'id'], name='ox_archive_queue'), models.Index(fields=['task_path', 'id'], name='ox_archive_path'), models.Index(fields=['status', 'id'], name='ox_archive_status'), PartialIndex(condition=models.Q(('status__in', ['FAILED', 'CANCELLED'])), fields=['status', 'queue', 'id'], name='ox_archive_failed_queue')],
            },
        ),
        migrations.RunPython(set_storage, reset_storage, elidable=False),
    ]
