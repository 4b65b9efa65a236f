"""Interrupt a sync task inside its thread by raising an exception there.

CPython delivers the exception at the thread's next bytecode, so a task blocked in C (a long
sleep, a socket read with no timeout) notices only when that call returns: the worker treats
a thread that outlives its interrupt by the grace period as stuck.
"""

import ctypes
import threading
import uuid

from ox.exceptions import TaskInterrupt


def _raise_in(thread_id: int, exc_type: type[BaseException] | None) -> None:
    if exc_type is None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.c_void_p(0))
    else:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc_type))


class Interrupter:
    """Which thread runs which task, so an interrupt never lands in the wrong task."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads: dict[uuid.UUID, int] = {}
        self._sent: set[uuid.UUID] = set()  # interrupted: may have an exception pending

    def enter(self, task_id: uuid.UUID) -> None:
        with self._lock:
            self._threads[task_id] = threading.get_ident()

    def leave(self, task_id: uuid.UUID) -> None:
        # An interrupt sent just as the task returned may still be pending (or may fire
        # inside this method): clear it under the lock, retrying if it fires first.
        for _ in range(100):
            try:
                with self._lock:
                    self._threads.pop(task_id, None)
                    if task_id in self._sent:
                        self._sent.discard(task_id)
                        _raise_in(threading.get_ident(), None)
                return
            except TaskInterrupt:
                continue

    def interrupt(self, task_id: uuid.UUID, exc_type: type[TaskInterrupt]) -> bool:
        with self._lock:
            thread_id = self._threads.get(task_id)
            if thread_id is None:
                return False
            self._sent.add(task_id)
            _raise_in(thread_id, exc_type)
            return True
