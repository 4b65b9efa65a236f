from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from ox import clock
from ox.backend import OxBackend
from ox.durations import parse_duration
from ox.enqueue import database_for
from ox.management.backends import add_backend_argument, ox_backend
from ox.models import FINISHED
from ox.prune import prune, prune_workers


class Command(BaseCommand):
    help = (
        "Delete finished tasks (and their attempts) older than a retention, in batches. Without"
        " --older-than, the backend's retention applies (OPTIONS PRUNE over ox's defaults: SUCCESSFUL and"
        " CANCELLED 7d, FAILED 30d). Worker rows go after OPTIONS PRUNE_WORKERS (7d)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--older-than", help="Age of the finished_at to prune, e.g. 90m, 12h, 7d, 2w.")
        parser.add_argument(
            "--status",
            default=",".join(FINISHED),
            help=f"Comma-separated finished statuses (default: {','.join(FINISHED)}).",
        )
        parser.add_argument("--batch-size", type=int, default=None, help="Rows per transaction (OPTIONS PRUNE_BATCH).")
        parser.add_argument("--dry-run", action="store_true", help="Print how many rows would go; delete nothing.")
        add_backend_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        backend = ox_backend(options["backend"])
        rules = self._rules(backend, options)
        batch = backend.config.prune_batch if options["batch_size"] is None else options["batch_size"]
        if batch < 1:
            raise CommandError("--batch-size must be at least 1")
        conn = connections[database_for(backend)]
        now = clock.db_now(conn)
        result = prune(conn, rules, now, batch, dry_run=options["dry_run"])
        verb = "would delete" if options["dry_run"] else "deleted"
        for status, count in result.deleted.items():
            cutoff = now - rules[status]
            self.stdout.write(f"{status}: {verb} {count} tasks finished before {cutoff.isoformat(timespec='seconds')}")
        if not options["dry_run"]:
            self.stdout.write(f"total: {result.total} tasks in {result.batches} batches of at most {batch}")
            workers = backend.config.worker_retention()
            if workers is not None:
                gone = 0
                while (n := prune_workers(conn, now - workers, batch)) and n > 0:
                    gone += n
                    if n < batch:
                        break
                since = (now - workers).isoformat(timespec="seconds")
                self.stdout.write(f"workers: deleted {gone} rows stopped or silent since before {since}")

    @staticmethod
    def _rules(backend: OxBackend, options: dict[str, Any]) -> dict[str, Any]:
        statuses = [s.strip().upper() for s in options["status"].split(",") if s.strip()]
        unknown = sorted(set(statuses) - set(FINISHED))
        if unknown or not statuses:
            raise CommandError(f"--status takes finished statuses ({', '.join(FINISHED)}), got {options['status']!r}")
        if options["older_than"] is None:
            rules = {s: age for s, age in backend.config.prune_rules().items() if s in statuses}
            if not rules:
                raise CommandError(
                    "OPTIONS PRUNE keeps every status asked for: give --older-than, or a retention in OPTIONS PRUNE."
                )
            return rules
        try:
            age = parse_duration(options["older_than"])
        except ValueError as exc:
            raise CommandError(f"--older-than: {exc}") from exc
        return dict.fromkeys(statuses, age)
