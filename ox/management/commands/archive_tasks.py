from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from ox import clock
from ox.archive import archive
from ox.durations import parse_duration
from ox.enqueue import database_for
from ox.management.backends import add_backend_argument, ox_backend


class Command(BaseCommand):
    help = (
        "Move finished tasks older than an age from ox_task to ox_task_archive, oldest first, in"
        " batches (what the workers' archive duty does). Without --older-than: OPTIONS ARCHIVE_AFTER."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--older-than", help="Age of the finished_at to archive, e.g. 0, 90s, 5m, 12h.")
        parser.add_argument(
            "--batch-size", type=int, default=None, help="Rows per transaction (OPTIONS ARCHIVE_BATCH)."
        )
        add_backend_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        backend = ox_backend(options["backend"])
        if options["older_than"] is not None:
            try:
                age = parse_duration(options["older_than"])
            except ValueError as exc:
                raise CommandError(f"--older-than: {exc}") from exc
        else:
            age = backend.config.archive_age()
            if age is None:
                raise CommandError("OPTIONS ARCHIVE_AFTER is None (archiving is off): give --older-than.")
        batch = backend.config.archive_batch if options["batch_size"] is None else options["batch_size"]
        if batch < 1:
            raise CommandError("--batch-size must be at least 1")
        conn = connections[database_for(backend)]
        # Waits for the advisory lock if a worker is archiving (each batch is short).
        result = archive(conn, age, clock.db_now(conn), batch)
        for status, count in result.moved.items():
            self.stdout.write(f"{status}: moved {count} tasks")
        self.stdout.write(f"total: {result.total} tasks in {result.batches} batches of at most {batch}")
