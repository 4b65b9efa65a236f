"""The --backend option every ox command takes."""

from django.core.management.base import CommandError, CommandParser
from django.tasks import DEFAULT_TASK_BACKEND_ALIAS, task_backends
from django.tasks.exceptions import InvalidTaskBackend

from ox.backend import OxBackend


def add_backend_argument(parser: CommandParser) -> None:
    parser.add_argument("--backend", default=DEFAULT_TASK_BACKEND_ALIAS, help="TASKS alias.")


def ox_backend(alias: str) -> OxBackend:
    """The ox backend under this TASKS alias, or a CommandError that says what is wrong."""
    try:
        backend = task_backends[alias]
    except InvalidTaskBackend as exc:
        raise CommandError(str(exc)) from exc
    if not isinstance(backend, OxBackend):
        raise CommandError(f"Backend {alias!r} is not an ox backend.")
    return backend
