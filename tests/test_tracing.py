"""OpenTelemetry (ox.tracing), with the SDK's in-memory exporter: an enqueue inside a span
carries its trace context in the task's metadata; each attempt is a CONSUMER span under the
messaging conventions, a child of that context and linked to it; a failure is an ERROR span
with the exception; without opentelemetry installed nothing changes."""

import os
import subprocess
import sys

import pytest
from django.tasks import task_backends
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from ox.models import Task
from ox.tracing import OTEL_KEY
from ox.worker import Worker, WorkerSettings
from tests import otel_tasks, tasks
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db(transaction=True)

_exporter = InMemorySpanExporter()


@pytest.fixture
def spans():
    """This process's spans, kept in memory (the global provider can be set once per process)."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
        trace.set_tracer_provider(provider)
    _exporter.clear()
    yield _exporter
    _exporter.clear()


def drain() -> None:
    Worker(task_backends["default"], WorkerSettings(queues=["default"], batch=True)).run()


def attempt_spans(exporter):
    return [s for s in exporter.get_finished_spans() if s.kind == SpanKind.CONSUMER]


def test_an_enqueue_inside_a_span_carries_its_trace_context(spans):
    with trace.get_tracer("tests").start_as_current_span("web request") as request_span:
        r = tasks.echo.using(metadata={"mine": 1}).enqueue(1)
    carried = Task.objects.get(id=r.id).metadata
    trace_id = format(request_span.get_span_context().trace_id, "032x")
    assert carried["mine"] == 1 and trace_id in carried[OTEL_KEY]["traceparent"]
    outside = tasks.echo.enqueue(2)
    assert Task.objects.get(id=outside.id).metadata is None  # no span, no metadata written


def test_each_attempt_is_a_consumer_span_in_the_enqueuers_trace(spans):
    with trace.get_tracer("tests").start_as_current_span("web request") as request_span:
        r = otel_tasks.traced_ok.enqueue()
    drain()
    (span,) = attempt_spans(spans)
    enqueued_in = request_span.get_span_context()
    assert span.name == "process default"
    assert span.context.trace_id == enqueued_in.trace_id and span.parent.span_id == enqueued_in.span_id
    assert [link.context.span_id for link in span.links] == [enqueued_in.span_id]
    assert dict(span.attributes) == {
        "messaging.system": "ox",
        "messaging.destination.name": "default",
        "messaging.message.id": str(r.id),
        "messaging.operation.type": "process",
        "messaging.operation.name": "tests.otel_tasks.traced_ok",
        "ox.attempt": 1,
        "ox.outcome": "successful",
    }
    assert span.status.status_code == StatusCode.UNSET


def test_a_failed_attempt_is_an_error_span_with_its_exception(spans):
    otel_tasks.traced_fails.enqueue()
    drain()
    (span,) = attempt_spans(spans)
    assert span.status.status_code == StatusCode.ERROR and "no such invoice" in span.status.description
    (event,) = [e for e in span.events if e.name == "exception"]
    assert event.attributes["exception.type"] == "LookupError"
    assert span.parent is None  # enqueued outside any span: a trace of its own


def test_spans_made_inside_an_async_task_are_children_of_its_attempt(spans):
    otel_tasks.traced_async_child.enqueue()
    drain()
    (attempt,) = attempt_spans(spans)
    (inner,) = [s for s in spans.get_finished_spans() if s.name == "inside the task"]
    assert inner.parent.span_id == attempt.context.span_id


def test_without_opentelemetry_installed_tasks_run_as_ever(tmp_path):
    from tests.conftest import database_url

    script = """
import sys
sys.modules["opentelemetry"] = None  # as if the extra were not installed: every import of it fails
import django
django.setup()
from django.tasks import task_backends, TaskResultStatus
import ox.tracing
assert not ox.tracing.enabled()
from ox.worker import Worker, WorkerSettings
from tests import tasks
r = tasks.echo.using(metadata={"a": 1}).enqueue(5)
Worker(task_backends["default"], WorkerSettings(queues=["default"], batch=True)).run()
done = task_backends["default"].get_result(r.id)
assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == 5 and done.metadata == {"a": 1}
print("untraced ok")
"""
    env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "untraced ok" in done.stdout, done.stdout + done.stderr
