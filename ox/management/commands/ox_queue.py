import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ox.enqueue import database_for
from ox.flow import queues
from ox.flow.waiting import describe, queue_flows
from ox.management.backends import add_backend_argument, ox_backend


class Command(BaseCommand):
    help = (
        "Pause, resume or show queues, or override their limits at run time: ox_queue pause NAME,"
        " ox_queue resume NAME, ox_queue status [NAME...] [--json], ox_queue limits NAME"
        " concurrency=4 rate=50/s (a field=none lifts that limit; --reset goes back to the settings)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "action", choices=["pause", "resume", "status", "limits"], help="What to do (see the command's help)."
        )
        parser.add_argument("names", nargs="*", help="Queue name(s); for limits: NAME then field=value pairs.")
        parser.add_argument("--json", action="store_true", help="status: one JSON document.")
        parser.add_argument("--reset", action="store_true", help="limits: drop the run-time overrides.")
        add_backend_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        backend = ox_backend(options["backend"])
        db = database_for(backend)
        action, names = options["action"], options["names"]
        try:
            if action in ("pause", "resume"):
                if not names:
                    raise CommandError(f"ox_queue {action} needs a queue name")
                for name in names:
                    self._known(backend, name)
                    getattr(queues, action)(name, using=db, by="manage.py ox_queue")
                    self.stdout.write(f"{name}: {'paused' if action == 'pause' else 'resumed'}")
            elif action == "limits":
                self._limits(backend, db, names, options["reset"])
            else:
                self._status(db, names or None, options["json"])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc

    def _known(self, backend: Any, name: str) -> None:
        if backend.queues and name not in backend.queues:
            known = ", ".join(sorted(backend.queues))
            raise CommandError(f"queue {name!r} is not in this backend's QUEUES ({known})")

    def _limits(self, backend: Any, db: str, names: list[str], reset: bool) -> None:
        if not names:
            raise CommandError("ox_queue limits needs a queue name")
        name, pairs = names[0], names[1:]
        self._known(backend, name)
        if reset == bool(pairs):
            raise CommandError("give field=value pairs, or --reset (not both)")
        overrides: dict[str, Any] = {}
        for pair in pairs:
            field, sep, value = pair.partition("=")
            if not sep:
                raise CommandError(f"{pair!r}: expected field=value, e.g. concurrency=4")
            if value.lower() in ("none", "null", ""):
                overrides[field] = None
            elif field.endswith("concurrency"):
                try:
                    overrides[field] = int(value)
                except ValueError:
                    raise CommandError(f"{field} must be a whole number, got {value!r}") from None
            else:
                overrides[field] = value
        queues.set_limits(name, {} if reset else overrides, using=db, by="manage.py ox_queue")
        self._status(db, [name], False)

    def _status(self, db: str, names: list[str] | None, as_json: bool) -> None:
        flows = queue_flows(names, db)
        if as_json:
            self.stdout.write(json.dumps([describe(f) for f in flows], indent=2))
            return
        for f in flows:
            state = "paused" if f.view.paused else "running"
            self.stdout.write(
                f"{f.name}: {state}; limits: {f.limits.describe()}; running {f.running}, due {f.due}"
                f"{'+' if f.due_capped else ''}, scheduled {f.scheduled}, waiting on a limit {f.waiting_on_limit}"
                + (f" ({'; '.join(f.reasons)})" if f.reasons else "")
            )
