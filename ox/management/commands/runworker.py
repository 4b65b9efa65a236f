import logging
import os
import signal
import sys
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ox.management.backends import add_backend_argument, ox_backend
from ox.supervisor import Supervisor, child_command
from ox.worker import Worker, WorkerSettings


def positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError(value)
    return number


class Command(BaseCommand):
    help = "Run an ox worker: claim tasks from the database and run them."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--queues", default="", help="Comma-separated queues (default: all of the backend's).")
        parser.add_argument("--concurrency", type=positive_int, default=1, help="Threads for sync tasks.")
        parser.add_argument("--async-concurrency", type=positive_int, default=100, help="Async tasks at once.")
        parser.add_argument("--processes", type=positive_int, default=1, help="Worker processes, supervised.")
        parser.add_argument("--batch", action="store_true", help="Exit once no task is due and none is running.")
        parser.add_argument("--max-tasks", type=positive_int, default=None, help="Exit after claiming this many.")
        parser.add_argument("--interval", type=float, default=None, help="Idle poll interval in seconds.")
        add_backend_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        backend = ox_backend(options["backend"])
        if options["interval"] is not None and options["interval"] <= 0:
            raise CommandError("--interval must be positive")
        if options["processes"] > 1:
            supervisor = Supervisor(child_command(sys.argv), options["processes"], backend.config.shutdown_grace)
            sys.exit(supervisor.run())
        queues = [q.strip() for q in options["queues"].split(",") if q.strip()] or sorted(backend.queues)
        if not queues:
            # Django reads an empty QUEUES as "any queue may be enqueued to"; a worker claims
            # per queue, so it must be told which ones, or it would wait forever for nothing.
            raise CommandError(
                f"The backend {backend.alias!r} has QUEUES = [] (any queue is accepted): name the queues"
                " this worker takes with --queues a,b"
            )
        try:
            worker = Worker(
                backend,
                WorkerSettings(
                    queues=queues,
                    concurrency=options["concurrency"],
                    async_concurrency=options["async_concurrency"],
                    batch=options["batch"],
                    max_tasks=options["max_tasks"],
                    poll_interval=options["interval"],
                ),
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc

        def on_signal(_signum: int, _frame: FrameType | None) -> None:
            if worker.stopping:
                # Second signal: leave at once; the rescuer takes back what was running.
                os._exit(1)
            worker.request_stop()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        code = worker.run()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        # os._exit: a task thread that ignored its interrupt must not keep the process alive.
        os._exit(code)
