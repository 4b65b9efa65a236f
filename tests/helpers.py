import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], object], timeout: float = 30.0, interval: float = 0.05) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s")
