from django.apps import AppConfig


class OxConfig(AppConfig):
    name = "ox"
    verbose_name = "Task queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from ox import checks  # noqa: F401  (registers the system checks)
