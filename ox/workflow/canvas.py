"""Chains and groups: what a workflow is made of, and its enqueue (one transaction).

    ox.chain(fetch.s(url), resize.s(640), publish.s())        # each gets the one before's result
    ox.group([export.s(n) for n in range(500)]).then(report.s())  # report gets all 500 results

A signature (`task.s(...)`, or `ox.sig(task, ...)` for any ox task) is a call not yet made. In
a chain, a task after a single task gets that task's return value as its first argument;
after a group, the list of the group's return values, in the group's order. A task waits
PENDING, never claimed, until every task it comes after has succeeded; the transaction that
records the last of them makes it READY (ox.workflow.join)."""

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import connections, transaction
from django.tasks import Task as DjangoTask
from django.tasks import TaskResult
from django.tasks.signals import task_enqueued

from ox import clock, sql
from ox.enqueue import database_for, new_task
from ox.results import ready_result

# One edge per (task before, task after): a group of N followed by a group of M is N x M edges.
# Past this a workflow is refused rather than written (put a single task between the groups).
MAX_EDGES = 100_000


@dataclass(frozen=True)
class Sig:
    """One call of a task, to be made when the workflow gets to it."""

    task: DjangoTask
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def then(self, *after: "Node") -> "Chain":
        return Chain((self, *after))

    def enqueue(self, **options: Any) -> "WorkflowRun":
        return enqueue(self, **options)


@dataclass(frozen=True)
class Chain:
    items: tuple["Node", ...]

    def then(self, *after: "Node") -> "Chain":
        return Chain((*self.items, *after))

    def enqueue(self, **options: Any) -> "WorkflowRun":
        return enqueue(self, **options)


@dataclass(frozen=True)
class Group:
    items: tuple["Node", ...]

    def then(self, *after: "Node") -> Chain:
        """A callback (or a chain of them) run once, after every member succeeded, with the
        list of the members' results."""
        return Chain((self, *after))

    def enqueue(self, **options: Any) -> "WorkflowRun":
        return enqueue(self, **options)


Node = Sig | Chain | Group


def sig(task: DjangoTask, *args: Any, **kwargs: Any) -> Sig:
    if not isinstance(task, DjangoTask):
        raise TypeError(f"a workflow is made of tasks (a @task function's Task), not {task!r}")
    return Sig(task, args, kwargs)


def chain(*items: Node) -> Chain:
    return Chain(tuple(_checked(items, "chain")))


def group(items: Iterable[Node]) -> Group:
    return Group(tuple(_checked(list(items), "group")))


def _checked(items: Sequence[Any], what: str) -> list[Node]:
    if not items:
        raise ValueError(f"an empty {what}: give it at least one task")
    for item in items:
        if not isinstance(item, Sig | Chain | Group):
            raise TypeError(f"a {what} takes signatures (task.s(...)), chains and groups, not {item!r}")
    return list(items)


@dataclass
class WorkflowRun:
    """What enqueue() returns: the workflow's id and one TaskResult per task, in the order
    the workflow was written (for a chain: first to last)."""

    id: uuid.UUID
    results: list[TaskResult]

    @property
    def last(self) -> TaskResult:
        return self.results[-1]


@dataclass
class _Graph:
    sigs: list[Sig] = field(default_factory=list)
    # (parent index, child index, position, gather)
    edges: list[tuple[int, int, int, bool]] = field(default_factory=list)

    def add(self, node: Node) -> tuple[list[int], list[int]]:
        """Add a node; returns its heads (what starts it) and tails (what ends it)."""
        if isinstance(node, Sig):
            self.sigs.append(node)
            at = len(self.sigs) - 1
            return [at], [at]
        if isinstance(node, Group):
            heads: list[int] = []
            tails: list[int] = []
            for item in node.items:
                h, t = self.add(item)
                heads += h
                tails += t
            return heads, tails
        first_heads, tails = self.add(node.items[0])
        before = node.items[0]
        for item in node.items[1:]:
            heads, next_tails = self.add(item)
            # After a group (even a group of one), the list of its results; also after a chain
            # nested in this one that ends in a group.
            gather = len(tails) > 1 or _ends_in_group(before)
            before = item
            if len(self.edges) + len(tails) * len(heads) > MAX_EDGES:
                raise ValueError(
                    f"this workflow needs more than {MAX_EDGES:,} edges (a group of {len(tails):,} followed by"
                    f" {len(heads):,} tasks): put a single task between the two"
                )
            for child in heads:
                self.edges += [(parent, child, position, gather) for position, parent in enumerate(tails)]
            tails = next_tails
        return first_heads, tails


def _ends_in_group(node: Node) -> bool:
    while isinstance(node, Chain):
        node = node.items[-1]
    return isinstance(node, Group)


def enqueue(node: Node, *, policy: str = "stop", on_failure: Sig | None = None, name: str = "") -> WorkflowRun:
    """Enqueue a whole workflow in one transaction: its row, its tasks (the first ones READY,
    the rest PENDING) and its edges. policy: "stop" (a task that fails for good cancels what
    comes after it) or "continue" (what comes after runs, the failed task's result None).
    on_failure: a task enqueued once, when the first task fails for good, with
    {"workflow", "task", "status"} as its first argument."""
    from ox.models import Task as TaskRow
    from ox.workflow.models import Edge, Policy, Workflow

    if policy not in Policy.values:
        raise ValueError(f"policy must be one of {', '.join(Policy.values)}, not {policy!r}")
    if on_failure is not None and not isinstance(on_failure, Sig):
        raise TypeError("on_failure takes a signature (task.s(...))")
    graph = _Graph()
    graph.add(node)
    backend = graph.sigs[0].task.get_backend()
    for s in [*graph.sigs, *([on_failure] if on_failure else [])]:
        if s.task.backend != graph.sigs[0].task.backend:
            raise ValueError("every task of a workflow goes to one backend (one database)")
        if getattr(s.task, "unique", None) is not None:
            raise ValueError(f"{s.task.module_path} is unique: a workflow's tasks cannot be (a duplicate stalls it)")
        backend.validate_task(s.task)
    conn = connections[database_for(backend)]
    now = clock.db_now(conn)
    rows = [new_task(backend, s.task, s.args, s.kwargs, now) for s in graph.sigs]
    waiting = [0] * len(rows)
    for _parent, child, _position, _gather in graph.edges:
        waiting[child] += 1
    spec = None
    if on_failure is not None:
        # Checked now, enqueued later: its arguments must go through JSON like any task's.
        first = new_task(backend, on_failure.task, on_failure.args, on_failure.kwargs, now)
        spec = {
            "task_path": first.task_path,
            "queue": first.queue,
            "priority": first.priority,
            "args": first.args,
            "kwargs": first.kwargs,
            "max_attempts": first.max_attempts,
            "is_async": first.is_async,
        }
    flow = Workflow(name=name[:200], policy=policy, on_failure=spec, created_at=now)
    with transaction.atomic(using=conn.alias):
        flow.save(using=conn.alias, force_insert=True)
        # Inserted READY (the enqueue path: NOTIFY on PostgreSQL, the wake-up on MariaDB),
        # then the ones that wait are made PENDING before anything commits.
        sql.insert_tasks(conn, rows)
        ids = [r.id for r in rows]
        TaskRow.objects.using(conn.alias).filter(id__in=ids).update(workflow_id=flow.id)
        by_count: dict[int, list[uuid.UUID]] = {}
        for row, count in zip(rows, waiting, strict=True):
            if count:
                by_count.setdefault(count, []).append(row.id)
        for count, waiters in by_count.items():
            TaskRow.objects.using(conn.alias).filter(id__in=waiters).update(status="PENDING", waiting=count)
        Edge.objects.using(conn.alias).bulk_create(
            [
                Edge(
                    workflow_id=flow.id,
                    parent_id=rows[p].id,
                    child_id=rows[c].id,
                    position=pos,
                    gather=gather,
                )
                for p, c, pos, gather in graph.edges
            ],
            batch_size=1000,
        )
    results = [ready_result(row, s.task, backend.alias) for row, s in zip(rows, graph.sigs, strict=True)]
    for result, count in zip(results, waiting, strict=True):
        if count == 0:
            task_enqueued.send(type(backend), task_result=result)
    return WorkflowRun(flow.id, results)


def input_text(edges: Sequence[tuple[bool, str | None]]) -> str:
    """A task's first argument from its edges (gather, result JSON), in position order."""
    values = ["null" if r is None else r for _g, r in edges]
    if edges and edges[0][0]:
        return "[" + ", ".join(values) + "]"
    return values[0]


def with_input(args_json: str, first: str) -> str:
    """The args list with `first` (JSON text) put before the task's own arguments (spliced as
    text: the arguments are not decoded and encoded again)."""
    text = args_json.strip()
    if not (text.startswith("[") and text.endswith("]")):
        raise ValueError(f"a workflow task's args must be a list, not {args_json[:100]!r}")
    inner = text[1:-1].strip()
    return "[" + first + (", " + inner if inner else "") + "]"
