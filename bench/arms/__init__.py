"""One module per system under test. An arm knows how its system enqueues, how its worker is
started, and how to read progress from its own table. Arms import Django models, so they
are loaded only inside an agent process that has the arm's settings (bench.agent)."""

from importlib import import_module
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
}
ARM_NAMES = tuple(ARMS)
# The Django Tasks backends: every cell runs them unless it says otherwise. Other arms join a
# cell explicitly (bench.plan_pgqueuer, bench.plan_procrastinate), and say why for the cells they do not run.
DJANGO_ARMS = ("ox", "django-tasks-db", "django-ox")


def load(name: str) -> "Arm":
    return import_module(ARMS[name][1]).ARM
