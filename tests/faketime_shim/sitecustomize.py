"""Loaded (through PYTHONPATH) only into worker processes that tests/test_clock.py starts under
libfaketime. libfaketime 0.9.10 (Debian 12) fails Python's time.sleep with EINVAL when it leaves
the monotonic clock alone (CPython 3.11+ sleeps with clock_nanosleep on an absolute monotonic
deadline), and hangs every timed lock wait when it fakes it. So it leaves the monotonic clock
alone and time.sleep waits on an Event instead, which libfaketime does not touch. Nothing else
changes: the skewed wall clock is libfaketime's, in libc."""

import threading
import time


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    threading.Event().wait(seconds)


time.sleep = _sleep
