import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


def database_url() -> str:
    """The test database, as a URL a worker subprocess can use."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    host = s.get("HOST") or "127.0.0.1"
    scheme, port = ("mysql", 3306) if connection.vendor == "mysql" else ("postgres", 5432)
    return f"{scheme}://{s['USER']}@{host}:{s.get('PORT') or port}/{s['NAME']}"


class WorkerProcess:
    def __init__(self, args: list[str], env: dict[str, str], log: Path, prefix: list[str] | None = None) -> None:
        self.log = log
        self._log_file = log.open("wb")
        # prefix: a command that execs the worker in place (the pid stays the worker's), e.g.
        # ["ip", "netns", "exec", name] to run it in a network namespace.
        self.proc = subprocess.Popen(
            [*(prefix or []), sys.executable, str(ROOT / "manage.py"), "runworker", *args],
            cwd=ROOT,
            env=env,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, signum: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signum)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def output(self) -> str:
        self._log_file.flush()
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log_file.close()


@pytest.fixture(autouse=True)
def _fresh_executor_connection() -> Iterator[None]:
    """Close the connections held by asgiref's shared executor thread after every test.

    sync_to_async runs Django's ORM in one long-lived thread when no async_to_sync is around
    (an asyncio.run in a thread of a test's own). Its connection outlives the test that opened
    it, and tests that end every session of the database (pg_terminate_backend, KILL) leave it
    dead: Django checks usability only around requests, so a later test's aenqueue failed on
    "terminating connection due to administrator command" (CI, PostgreSQL leg)."""
    yield
    from asgiref.sync import SyncToAsync
    from django.db import connections

    SyncToAsync.single_thread_executor.submit(connections.close_all).result(timeout=30)


@pytest.fixture
def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url(),
        DJANGO_SETTINGS_MODULE="tests.settings",
        PYTHONUNBUFFERED="1",
        OX_LOG_LEVEL=os.environ.get("OX_LOG_LEVEL", "INFO"),
    )
    return env


@pytest.fixture
def start_worker(worker_env, tmp_path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start `manage.py runworker` subprocesses; every one is killed (by pid) at teardown."""
    started: list[WorkerProcess] = []

    def start(*args: str, env: dict[str, str] | None = None, prefix: list[str] | None = None) -> WorkerProcess:
        log = tmp_path / f"worker-{len(started)}.log"
        worker = WorkerProcess(list(args), {**worker_env, **(env or {})}, log, prefix)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture
def listener():
    """A LISTEN ox_task session of its own (PostgreSQL); call it for the payloads that arrive
    within `timeout` seconds of the last one."""
    from ox.connection import open_worker_connection

    conn = open_worker_connection(connection.alias)
    conn.connection.execute("LISTEN ox_task")

    def received(timeout: float = 0.3) -> list[str]:
        return [n.payload for n in conn.connection.notifies(timeout=timeout)]

    yield received
    conn.close()
