"""One module per system under test. An arm knows how its system enqueues, how its worker is
started, and how to read progress from its own table. Arms import Django models, so they
are loaded only inside an agent process that has the arm's settings (bench.agent)."""

from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.arms.base import Arm

# name -> (settings module, arm module, PostgreSQL database)
ARMS: dict[str, tuple[str, str, str]] = {
    "ox": ("bench.settings_ox", "bench.arms.ox", "oxbench_ox"),
    "django-tasks-db": ("bench.settings_tasksdb", "bench.arms.tasksdb", "oxbench_tasksdb"),
    "django-ox": ("bench.settings_djangoox", "bench.arms.djangoox", "oxbench_djangoox"),
    # Not a Django backend: its agent loads Django only for the harness's own reads (ledger,
    # counts); its workers are pgqueuer processes without Django (bench.pgq_worker).
    "pgqueuer": ("bench.settings_pgqueuer", "bench.arms.pgqueuer", "oxbench_pgqueuer"),
    # Its Django contrib app in the agent and the workers (bench.procrastinate_worker), but not a
    # Django Tasks backend: enqueues are procrastinate's task.defer().
    "procrastinate": ("bench.settings_procrastinate", "bench.arms.procrastinate", "oxbench_procrastinate"),
    # The Python port of Oban: its own asyncio workers (bench.oban_worker), no Django in them.
    "oban": ("bench.settings_oban", "bench.arms.oban", "oxbench_oban"),
    # A Django Tasks backend, but joined cell by cell like the other peers (bench.plan_peers).
    "dj-queue": ("bench.settings_djqueue", "bench.arms.djqueue", "oxbench_djqueue"),
    # Celery on Redis: the database holds only the ledger; its agent and workers run in
    # bench/.venv-celery (Celery pins python-dateutil 2.9.0.post0, pgqueuer's croniter wants 4.0.0).
    "celery": ("bench.settings_celery", "bench.arms.celery", "oxbench_celery"),
    # Not a system under test: the bound (bare psycopg SQL, no framework; bench.limit_sql), so
    # every figure also reads as a fraction of it. Last, so its column and ratio come last.
    "limit": ("bench.settings_limit", "bench.arms.limit", "oxbench_limit"),
}
ARM_NAMES = tuple(ARMS)
# The Django Tasks backends: every cell runs them unless it says otherwise. Other arms join a
# cell explicitly (bench.plan_pgqueuer, bench.plan_procrastinate), and say why for the cells they do not run.
DJANGO_ARMS = ("ox", "django-tasks-db", "django-ox")
# Arms whose dependencies clash with the shared bench/.venv: their agent (and so the workers it
# starts, on sys.executable) runs on bench/<venv>/bin/python, built by bench/run from
# bench/requirements-<arm>.txt.
VENVS: dict[str, str] = {"celery": ".venv-celery"}


def python_for(name: str, default: str) -> str:
    """The interpreter an arm's agent runs on: its own venv's, or `default` (the harness's)."""
    if name not in VENVS:
        return default
    return str(Path(__file__).resolve().parent.parent / VENVS[name] / "bin" / "python")


def load(name: str) -> "Arm":
    return import_module(ARMS[name][1]).ARM
