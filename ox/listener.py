"""PostgreSQL LISTEN for an idle worker: a thread on its own session that wakes the worker
loop when tasks are enqueued, so a task starts within milliseconds instead of at the next
poll. Polling stays the fallback: if this session drops, the worker only gets slower.

LISTEN is session state: through a transaction-mode pooler the session that LISTENs goes back
to the pool at once, and the notifications never reach this thread. So behind such a pooler
(ox OPTIONS POOLER = "transaction") there is no listener unless LISTEN_DATABASE names an alias
that reaches the same database directly; then this thread LISTENs there, and the worker's
claims still go through the pooler (ox.conf.OxOptions.listen_alias)."""

import logging
import threading
from collections.abc import Callable, Collection

from django.db import connections

from ox.connection import open_worker_connection
from ox.db import driver

logger = logging.getLogger("ox.worker")

CHANNEL = "ox_task"  # the trigger of migrations 0005 and 0010 notifies on it


class Listener:
    """queues: the worker's; a notification naming another queue (migration 0010's payload)
    is dropped here, so it costs the worker no claim. An empty payload wakes it whatever the
    queue (0005's trigger, or a manual NOTIFY ox_task)."""

    def __init__(self, alias: str, wake: Callable[[], None], queues: Collection[str] = ()) -> None:
        self.alias = alias
        self.wake = wake
        self.queues = frozenset(queues)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="ox-listen", daemon=True)

    @staticmethod
    def available(alias: str) -> bool:
        return driver(connections[alias]).notifies

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()

    def _run(self) -> None:
        delay, lost = 0.5, False
        while not self.stopped.is_set():
            try:
                conn = open_worker_connection(self.alias)
                try:
                    raw = conn.connection
                    raw.execute(f"LISTEN {CHANNEL}")
                    if lost:
                        self.wake()  # back after a gap: enqueues meanwhile notified no one
                    delay, lost = 0.5, True
                    while not self.stopped.is_set():
                        # Ends after `timeout` s without a notification, to look at `stopped`.
                        for note in raw.notifies(timeout=1.0, stop_after=1):
                            if not self.queues or not note.payload or note.payload in self.queues:
                                self.wake()
                finally:
                    conn.close()
            except Exception as exc:  # noqa: BLE001  (the poll still works; retry quietly)
                logger.info("listener session lost (%s); polling until it is back", exc)
                self.stopped.wait(delay)
                delay = min(delay * 2, 10.0)
