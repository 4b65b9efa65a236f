"""Where ox departs from Django 6.1's own tests/tasks suite (run against OxBackend).

Each test restates what one of Django's tests (or its backends' behaviour) expects, against
a real database and, where a task must run, an in-process ox worker in batch mode.
"""

import pytest
from django.tasks import TaskResultStatus, task, task_backends
from django.test import override_settings

from ox.worker import Worker, WorkerSettings
from tests import tasks
from tests.settings import TASKS as TEST_TASKS

QUEUES = TEST_TASKS["default"]["QUEUES"]
TWO_OX_BACKENDS = {
    "default": TEST_TASKS["default"],
    "second": {"BACKEND": "ox.backend.OxBackend", "QUEUES": QUEUES},
}
DUMMY_DEFAULT_OX_SECOND = {
    "default": {"BACKEND": "django.tasks.backends.dummy.DummyBackend", "QUEUES": QUEUES},
    "ox": {"BACKEND": "ox.backend.OxBackend", "QUEUES": QUEUES},
}


@task(max_attempts=1)
def returns_a_function():
    # Django's tests/tasks/tasks.py complex_return_value: neither JSON nor picklable.
    return lambda: True


@task(takes_context=True, max_attempts=1)
def own_backend(context):
    return [context.task_result.backend, context.task_result.task.backend]


def drain(alias: str = "default") -> None:
    """What ImmediateBackend does at enqueue: run everything due, here and now."""
    Worker(task_backends[alias], WorkerSettings(queues=["default"], batch=True)).run()


# -- Task.using(backend=...) ----------------------------------------------------------
# Django: a TaskResult's task is the Task as enqueued (DummyBackend stores it; the
# test_get_result tests compare get_result() with enqueue()'s result field by field), and
# TaskResult.refresh() reads through result.task.get_backend(). ox rebuilds the task from
# its module path and keeps the decorator's backend alias, so a task enqueued with
# .using(backend=...) comes back pointing at another backend.


@pytest.mark.django_db
@override_settings(TASKS=TWO_OX_BACKENDS)
def test_get_result_keeps_the_backend_the_task_was_enqueued_on():
    enqueued = tasks.echo.using(backend="second").enqueue(1)
    fetched = task_backends["second"].get_result(enqueued.id)
    assert fetched.task.backend == "second"
    assert fetched == enqueued


@pytest.mark.django_db
@override_settings(TASKS=DUMMY_DEFAULT_OX_SECOND)
def test_refresh_of_a_fetched_result_reads_the_backend_that_holds_it():
    enqueued = tasks.echo.using(backend="ox").enqueue(1)
    fetched = task_backends["ox"].get_result(enqueued.id)
    fetched.refresh()  # ox: goes to the DummyBackend ("default") -> TaskResultDoesNotExist
    assert fetched.status == TaskResultStatus.READY


@pytest.mark.django_db(transaction=True)
@override_settings(TASKS=TWO_OX_BACKENDS)
def test_task_context_result_names_the_backend_running_it():
    enqueued = own_backend.using(backend="second").enqueue()
    drain("second")
    fetched = task_backends["second"].get_result(enqueued.id)
    assert fetched.status == TaskResultStatus.SUCCESSFUL, fetched.errors
    assert fetched.return_value == ["second", "second"]


# -- test_immediate_backend.ImmediateBackendTestCase.test_complex_return_value ---------
# Django records the TypeError that normalize_json() raised for a return value it cannot
# serialize: errors[0].exception_class is TypeError, its traceback says "Unsupported type".
# ox records its own ox.storable.NotStorable (a ValueError) and drops the TypeError.


@pytest.mark.django_db(transaction=True)
def test_unserializable_return_value_is_recorded_as_the_typeerror():
    enqueued = returns_a_function.enqueue()
    drain()
    result = returns_a_function.get_result(enqueued.id)
    assert result.status == TaskResultStatus.FAILED
    assert result._return_value is None
    assert len(result.errors) == 1
    assert result.errors[0].exception_class is TypeError, result.errors[0].exception_class_path
    assert "Unsupported type" in result.errors[0].traceback
