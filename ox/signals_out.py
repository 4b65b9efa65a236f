"""task_finished, sent from a thread of its own once an outcome is durable: receivers are
user code, and a slow or broken one must not delay the worker loop (its heartbeats, its
leases). A failure's signal is sent inside an exception handler for its exception, as
Django's own backends do, so receivers (Django's log line among them) see sys.exc_info()."""

import json
import logging
import queue
import threading
from typing import Any

from django.tasks import TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.signals import task_finished

from ox.exceptions import TaskCancelled
from ox.execution import Finished
from ox.logs import event, task_fields

logger = logging.getLogger("ox.worker")


class FinishedSignals:
    def __init__(self, sender: type, worker_id: str) -> None:
        self.sender = sender
        self.worker_id = worker_id
        self.inbox: queue.Queue[tuple[Finished, TaskResultStatus] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="ox-signals", daemon=True)
        self.thread.start()

    def send(self, finished: Finished, status: TaskResultStatus) -> None:
        if finished.result is not None:
            self.inbox.put((finished, status))

    def stop(self, timeout: float) -> None:
        """Send what is queued (within `timeout` seconds: a receiver may hang)."""
        self.inbox.put(None)
        self.thread.join(timeout)

    def _run(self) -> None:
        while True:
            item = self.inbox.get()
            if item is None:
                return
            finished, status = item
            try:
                self._send(finished, status)
            except BaseException as exc:  # noqa: BLE001  (a receiver's bug, SystemExit too, is logged, nothing more)
                message = f"a task_finished receiver raised {exc!r}"
                event(logger, logging.ERROR, message, **task_fields(finished.claimed), worker=self.worker_id)

    def _send(self, finished: Finished, status: TaskResultStatus) -> None:
        result: Any = finished.result
        object.__setattr__(result, "status", status)
        object.__setattr__(result, "finished_at", finished.finished_at)
        if status == TaskResultStatus.SUCCESSFUL:
            object.__setattr__(result, "_return_value", json.loads(finished.return_json))
            task_finished.send(self.sender, task_result=result)
            return
        error = TaskError(exception_class_path=finished.exception_class_path, traceback=finished.traceback)
        result.errors.append(error)
        exc = finished.exception or TaskCancelled(finished.traceback.strip() or finished.kind)
        try:
            raise exc
        except BaseException:  # noqa: BLE001
            task_finished.send(self.sender, task_result=result)
