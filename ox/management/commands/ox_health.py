import json
from dataclasses import replace
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from ox.enqueue import database_for
from ox.health import Thresholds, check_health
from ox.management.backends import add_backend_argument, ox_backend
from ox.tablehealth import InnoDBTableHealth

EXIT_HEALTHY = 0
EXIT_UNHEALTHY = 1
EXIT_UNREACHABLE = 2

FLAGS = {  # flag -> (Thresholds field, type, help)
    "--max-backlog": ("max_backlog", int, "due READY tasks"),
    "--max-ready-age": ("max_ready_age", float, "seconds the oldest due READY task may wait"),
    "--max-stale-workers": ("max_stale_workers", int, "workers silent past --stale-after"),
    "--min-workers": ("min_workers", int, "alive workers required"),
    "--stale-after": ("stale_after", float, "seconds without a heartbeat before a worker is stale"),
    "--max-xact-age": ("max_xact_age", float, "PostgreSQL: seconds an open transaction may hold back VACUUM"),
}


class Command(BaseCommand):
    help = (
        "Check the queue against thresholds (defaults from the backend's OPTIONS). Exit 0 when"
        " healthy, 1 when a threshold is crossed, 2 when the database cannot be read."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        for flag, (_name, kind, text) in FLAGS.items():
            parser.add_argument(flag, type=kind, default=None, help=f"Maximum/minimum: {text}.")
        parser.add_argument("--json", action="store_true", help="Print the full report as JSON.")
        add_backend_argument(parser)
        parser.add_argument("--database", default=None, help="Database alias to read (default: the backend's).")

    def handle(self, *args: Any, **options: Any) -> None:
        backend = ox_backend(options["backend"])
        overrides = {name: options[flag[2:].replace("-", "_")] for flag, (name, _k, _t) in FLAGS.items()}
        thresholds = replace(
            Thresholds.from_options(backend.config), **{k: v for k, v in overrides.items() if v is not None}
        )
        try:
            health = check_health(thresholds, options["database"] or database_for(backend), queues=backend.queues)
        except DatabaseError as exc:
            raise CommandError(f"ox health: cannot read the database: {exc}", returncode=EXIT_UNREACHABLE) from exc
        if options["json"]:
            self.stdout.write(json.dumps(health.as_dict(), default=str, indent=2))
        else:
            for q in health.queues:
                # A count that stopped at the cap (ox.paging.COUNT_CAP) says so: "10000+ ready".
                ready = f"{q.ready}{'+' if q.ready_capped else ''}"
                scheduled = f"{q.scheduled}{'+' if q.scheduled_capped else ''}"
                self.stdout.write(
                    f"{q.queue}: {ready} ready, {scheduled} scheduled, {q.running} running,"
                    f" oldest ready {q.oldest_ready_age:.1f}s"
                )
            self.stdout.write(f"workers: {health.workers.alive} alive, {health.workers.stale} stale")
            if isinstance(health.table, InnoDBTableHealth):  # no dead tuples or autovacuum on InnoDB
                t = health.table
                history = "not available" if t.history_list_length is None else t.history_list_length
                self.stdout.write(
                    f"{t.table}: about {t.estimated_rows} rows, {t.total_bytes} bytes, {t.free_bytes} free,"
                    f" history list length {history}"
                )
            elif health.table is not None:
                t = health.table
                self.stdout.write(
                    f"{t.table}: {t.live_tuples} live, {t.dead_tuples} dead tuples, {t.total_bytes} bytes,"
                    f" last autovacuum {t.last_autovacuum.isoformat() if t.last_autovacuum else 'never'}"
                )
            self.stdout.write("healthy" if health.healthy else "UNHEALTHY")
        if not health.healthy:
            raise CommandError("; ".join(health.problems), returncode=EXIT_UNHEALTHY)
