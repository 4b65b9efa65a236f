import secrets
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser

from demo.tasks import add, always_fails, checksum, flaky_email, slow


class Command(BaseCommand):
    help = "First run: a local staff login (fresh random password) and a few demo tasks."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--username", default="admin", help="Staff login to create, or whose password to reset (default: admin)."
        )
        parser.add_argument("--no-tasks", action="store_true", help="Create the login only; enqueue no demo tasks.")
        parser.add_argument("--addr", default="127.0.0.1:8000", help="Where ./run serves the dashboard.")

    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()
        password = secrets.token_urlsafe(12)
        user, _created = User.objects.get_or_create(username=options["username"])
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        if not options["no_tasks"]:
            for i in range(5):
                add.enqueue(i, i * 10)
            checksum.enqueue("oxproject", rounds=20000)
            flaky_email.enqueue("ops@example.com")
            always_fails.enqueue("this task always fails: it shows retries, then FAILED")
            slow.using(run_after=timedelta(seconds=15)).enqueue(1.0)
        enqueued = (
            "  demo tasks enqueued: 5 add, 1 checksum, 1 flaky_email (fails twice, then succeeds),"
            " 1 always_fails (retries, then FAILED), 1 slow (delayed 15 s)\n"
            if not options["no_tasks"]
            else "  no demo tasks (--no-tasks)\n"
        )
        self.stdout.write(
            self.style.SUCCESS(
                f"\n  oxproject is starting on http://{options['addr']}/\n"
                f"  staff login: {options['username']} / {password}\n" + enqueued
            )
        )
