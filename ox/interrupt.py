"""Interrupt a sync task inside its thread by raising an exception there.

CPython delivers the exception at the thread's next bytecode, so a task blocked in C (a long
sleep, a socket read with no timeout) notices only when that call returns: the worker treats
a thread that outlives its interrupt by the grace period as stuck.
"""

import ctypes
import threading
from typing import Any

from ox.exceptions import TaskInterrupt


def _raise_in(thread_id: int, exc_type: type[BaseException] | None) -> None:
    if exc_type is None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.c_void_p(0))
    else:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc_type))


class Interrupter:
    """Which thread runs which claim (task id, fence), so an interrupt never lands in the
    wrong task, nor in a newer run of the same task."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads: dict[Any, int] = {}
        self._sent: set[Any] = set()  # interrupted: may have an exception pending

    def enter(self, key: Any) -> None:
        with self._lock:
            self._threads[key] = threading.get_ident()

    def leave(self, key: Any) -> None:
        # An interrupt sent just as the task returned may still be pending (or may fire
        # inside this method): clear it under the lock, retrying if it fires first.
        for _ in range(100):
            try:
                with self._lock:
                    self._threads.pop(key, None)
                    if key in self._sent:
                        self._sent.discard(key)
                        _raise_in(threading.get_ident(), None)
                return
            except TaskInterrupt:
                continue

    def interrupt(self, key: Any, exc_type: type[TaskInterrupt]) -> bool:
        with self._lock:
            thread_id = self._threads.get(key)
            if thread_id is None:
                return False
            self._sent.add(key)
            _raise_in(thread_id, exc_type)
            return True
