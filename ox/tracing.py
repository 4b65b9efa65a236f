"""OpenTelemetry, when `opentelemetry-api` is installed (the `otel` extra); without it every
function here does nothing. An enqueue inside a span carries that span's context in the
task's metadata (under OTEL_KEY, W3C trace context as the configured propagator writes it);
each attempt runs in a span of its own, a child of that context and linked to it, named and
described by OpenTelemetry's messaging conventions: system "ox", destination the queue,
message id the task id, operation "process" with the task's path as its name. A failed
attempt's span has status ERROR and the exception recorded."""

from typing import Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
except ImportError:  # the extra is not installed: tracing is off
    trace = None  # type: ignore[assignment]

OTEL_KEY = "otel"  # the metadata key that carries the enqueuer's trace context
SYSTEM = "ox"
_TRACER_NAME = "ox"


def enabled() -> bool:
    return trace is not None


def with_trace_context(metadata: dict[str, Any] | None) -> dict[str, Any] | None:
    """The task's metadata, with the current trace context added when a span is recording
    (a copy: the caller's dict is left alone). Unchanged when there is none."""
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return metadata
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    if not carrier:
        return metadata
    return {**(metadata or {}), OTEL_KEY: carrier}


class AttemptSpan:
    """One attempt's span, made current in the thread (or asyncio context) it starts in."""

    __slots__ = ("span", "token")

    def __init__(self, task_path: str, queue: str, task_id: str, attempt: int, metadata: dict[str, Any]) -> None:
        carrier = metadata.get(OTEL_KEY)
        parent = propagate.extract(carrier) if isinstance(carrier, dict) else None
        enqueued_in = trace.get_current_span(parent).get_span_context() if parent is not None else None
        links = [Link(enqueued_in)] if enqueued_in is not None and enqueued_in.is_valid else []
        self.span = trace.get_tracer(_TRACER_NAME).start_span(
            f"process {queue}",
            context=parent,
            kind=SpanKind.CONSUMER,
            links=links,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.destination.name": queue,
                "messaging.message.id": task_id,
                "messaging.operation.type": "process",
                "messaging.operation.name": task_path,
                "ox.attempt": attempt,
            },
        )
        self.token = otel_context.attach(trace.set_span_in_context(self.span))

    def detach(self) -> None:
        """No longer current here (an async attempt's own asyncio Task keeps it current)."""
        if self.token is not None:
            otel_context.detach(self.token)
            self.token = None

    def end(self, exception: BaseException | None, outcome: str, failed: bool) -> None:
        self.detach()
        self.span.set_attribute("ox.outcome", outcome)
        if failed:
            if exception is not None:
                self.span.record_exception(exception)
            self.span.set_status(Status(StatusCode.ERROR, _describe(exception) if exception else outcome))
        self.span.end()


def _describe(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"[:500]
    except Exception:  # noqa: BLE001  (an exception whose str() raises)
        return type(exc).__name__


def start_attempt(
    task_path: str, queue: str, task_id: str, attempt: int, metadata: dict[str, Any]
) -> AttemptSpan | None:
    if trace is None:
        return None
    return AttemptSpan(task_path, queue, task_id, attempt, metadata)
