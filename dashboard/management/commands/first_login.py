"""The first-run staff login: `./run` calls it before it starts the servers, so that whoever
started the project can sign in to the dashboard at once. It belongs to the dashboard (the
login is the dashboard's), not to the demo app, which a team may drop (`./run new NAME
--without-demo`)."""

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = "First run: create (or reset the password of) a local staff login and print it with the dashboard's URL."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--username", default="admin", help="Staff login to create, or whose password to reset (default: admin)."
        )
        parser.add_argument("--addr", default="127.0.0.1:8000", help="Where ./run serves the dashboard.")

    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()
        # A fresh password on every run: none is ever stored in the tree or reused, and a
        # forgotten one is a restart away.
        password = secrets.token_urlsafe(12)
        user, _created = User.objects.get_or_create(username=options["username"])
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        self.stdout.write(
            self.style.SUCCESS(
                f"\n  oxproject is starting on http://{options['addr']}/\n"
                f"  staff login: {options['username']} / {password}\n"
            )
        )
