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
}
ARM_NAMES = tuple(ARMS)


def load(name: str) -> "Arm":
    return import_module(ARMS[name][1]).ARM
