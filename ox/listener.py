"""The idle worker's listener: a thread on its own session that wakes the worker loop when
tasks are enqueued, so a task starts within milliseconds instead of at the next poll. How it
hears of them is the driver's: LISTEN on PostgreSQL, a lock wait that producers cut short with
KILL QUERY on MariaDB (ox.db.mysql.wake). Polling stays the fallback: if this session drops,
the worker only gets slower.

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
from ox.db.dialect import CHANNEL

__all__ = ["CHANNEL", "Listener"]

logger = logging.getLogger("ox.worker")


class Listener:
    """A thread on a session of its own that calls `wake` when tasks of `queues` may have
    been enqueued: the driver's way (ox.db.dialect.Dialect.listen). `lock_key`: the worker's
    (MariaDB names the listener's session after it)."""

    def __init__(
        self,
        alias: str,
        wake: Callable[[], None],
        queues: Collection[str] = (),
        lock_key: int = 0,
        on_enqueue: Callable[[], None] | None = None,
    ) -> None:
        self.alias = alias
        self.wake = wake
        # Called instead of `wake` where the wake-up is known to be an enqueue's (not a
        # queue's state change): the worker then claims before reading its queues' state.
        self.on_enqueue = on_enqueue
        self.queues = frozenset(queues)
        self.lock_key = lock_key
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
        self.delay, self.listened = 0.5, False
        while not self.stopped.is_set():
            try:
                conn = open_worker_connection(self.alias)
                try:
                    conn.ensure_connection()
                    driver(conn).listen(conn, self.lock_key, self.queues, self._heard, self.stopped, self._ready)
                finally:
                    conn.close()
            except Exception as exc:  # noqa: BLE001  (the poll still works; retry quietly)
                logger.info("listener session lost (%s); polling until it is back", exc)
                self.stopped.wait(self.delay)
                self.delay = min(self.delay * 2, 10.0)

    def _heard(self, enqueued: bool = False) -> None:
        if enqueued and self.on_enqueue is not None:
            self.on_enqueue()
        else:
            self.wake()

    def _ready(self) -> None:
        """The session listens: what is enqueued from now on wakes the worker. What was
        enqueued before woke no one (the worker may have marked itself idle, and looked
        again, before this session listened; or this is the session back after a gap): one
        wake-up for all of it."""
        self.wake()
        self.delay, self.listened = 0.5, True
