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


def in_fresh_thread[T](fn: Callable[[], T], timeout: float = 60.0) -> T:
    """fn() in a thread of its own, its result or its exception: an earlier test (Playwright's
    sync API) may have left this thread a running event loop, where asyncio.run() refuses to
    start."""
    import threading

    out: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001  (handed to the caller)
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise AssertionError(f"still running after {timeout} s")
    if errors:
        raise errors[0]
    return out[0]
