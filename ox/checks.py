"""System checks with stable ids (ox.E001...)."""

from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from ox.conf import OxOptions


@checks.register(checks.Tags.compatibility)
def check_options(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    for alias, params in getattr(settings, "TASKS", {}).items():
        if params.get("BACKEND") != "ox.backend.OxBackend":
            continue
        try:
            OxOptions.from_dict(params.get("OPTIONS", {}))
        except ImproperlyConfigured as exc:
            errors.append(checks.Error(f"TASKS[{alias!r}]: {exc}", id="ox.E001"))
    return errors
