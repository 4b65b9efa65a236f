from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand

import ox
from demo.tasks import add, album_workflow, always_fails, checksum, export_report, flaky_email, slow


class Command(BaseCommand):
    help = "First run: enqueue a few demo tasks (some succeed, one retries, one fails, one is delayed)."

    def handle(self, *args: Any, **options: Any) -> None:
        for i in range(5):
            add.enqueue(i, i * 10)
        checksum.enqueue("oxproject", rounds=20000)
        flaky_email.enqueue("ops@example.com")
        always_fails.enqueue("this task always fails: it shows retries, then FAILED")
        slow.using(run_after=timedelta(seconds=15)).enqueue(1.0)
        export_report.using(metadata={"requested_by": "demo"}).enqueue()
        album_workflow("holidays")
        ox.chain(add.s(1, 2), add.s(10), add.s(100)).enqueue(name="add along a chain")
        self.stdout.write(
            self.style.SUCCESS(
                "  demo tasks enqueued: 5 add, 1 checksum, 1 flaky_email (fails twice, then succeeds),"
                " 1 always_fails (retries, then FAILED), 1 slow (delayed 15 s),"
                " 1 export_report (a progress bar for about 10 s),"
                " 2 workflows (an album: fetch, 4 resizes in parallel, publish; a chain of adds)\n"
            )
        )
