import os

from django.apps import AppConfig
from django.conf import settings

# While ./run serves the project (it sets OX_RUN=1), demo.tasks.trickle is a periodic
# schedule of the default backend, so the overview's chart never lies flat. Elsewhere
# (production, the tests, manage.py by hand), or once the demo app is removed (./run new NAME
# --without-demo), there is no trickle.
TRICKLE = {"task": "demo.tasks.trickle", "every": 5}


class DemoConfig(AppConfig):
    name = "demo"
    verbose_name = "Demo tasks"

    def ready(self) -> None:
        backend = settings.TASKS.get("default", {})
        if os.environ.get("OX_RUN") == "1" and backend.get("BACKEND") == "ox.backend.OxBackend":
            options = backend.setdefault("OPTIONS", {})
            options.setdefault("SCHEDULES", {}).setdefault("demo-trickle", TRICKLE)
