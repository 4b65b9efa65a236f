"""A workflow drawn as a graph: its tasks in columns by depth (the longest way from a first
task), its edges as lines, each task coloured by its status. A column shows at most
COLUMN_CAP tasks; the rest of it is one summary box with their statuses counted, so a group of
1,000 draws as a readable picture (and a page of bounded size)."""

import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

COLUMN_CAP = 24
BOX_W, BOX_H = 170, 30
GAP_X, GAP_Y = 60, 12
PAD = 10


@dataclass
class Box:
    x: int
    y: int
    label: str
    status: str  # a Status value, or "more" for a column's summary
    task_id: uuid.UUID | None = None
    counts: list[tuple[str, int]] = field(default_factory=list)  # a summary's statuses


@dataclass
class Line:
    x1: int
    y1: int
    x2: int
    y2: int


@dataclass
class Drawing:
    boxes: list[Box]
    lines: list[Line]
    width: int
    height: int
    counts: list[tuple[str, int]]  # every task's status, counted


def layout(tasks: Iterable[tuple[uuid.UUID, str, str]], edges: Iterable[tuple[uuid.UUID, uuid.UUID]]) -> Drawing:
    """tasks: (id, task path, status) in the order they were enqueued; edges: (parent, child)."""
    tasks = list(tasks)
    edges = [(p, c) for p, c in edges]
    known = {t[0] for t in tasks}
    edges = [(p, c) for p, c in edges if p in known and c in known]  # pruned rows drop out
    depth = _depths([t[0] for t in tasks], edges)
    columns: dict[int, list[tuple[uuid.UUID, str, str]]] = defaultdict(list)
    for t in tasks:
        columns[depth[t[0]]].append(t)
    boxes: list[Box] = []
    where: dict[uuid.UUID, Box] = {}
    height = 0
    for col in sorted(columns):
        x = PAD + col * (BOX_W + GAP_X)
        members = columns[col]
        shown, rest = members[:COLUMN_CAP], members[COLUMN_CAP:]
        for row, (task_id, path, status) in enumerate(shown):
            box = Box(x, PAD + row * (BOX_H + GAP_Y), path.rsplit(".", 1)[-1][:22], status, task_id)
            boxes.append(box)
            where[task_id] = box
        if rest:
            counts = Counter(status for _i, _p, status in rest)
            more = Box(
                x, PAD + len(shown) * (BOX_H + GAP_Y), f"+{len(rest):,} more", "more", None, sorted(counts.items())
            )
            boxes.append(more)
            for task_id, _p, _s in rest:
                where[task_id] = more
        height = max(height, PAD + (len(shown) + (1 if rest else 0)) * (BOX_H + GAP_Y))
    lines = []
    seen: set[tuple[int, int]] = set()
    for parent, child in edges:
        a, b = where[parent], where[child]
        if (id(a), id(b)) in seen:
            continue  # many edges between two summaries: one line
        seen.add((id(a), id(b)))
        lines.append(Line(a.x + BOX_W, a.y + BOX_H // 2, b.x, b.y + BOX_H // 2))
    width = PAD + (max(columns, default=0) + 1) * (BOX_W + GAP_X)
    return Drawing(boxes, lines, width, max(height, BOX_H + 2 * PAD), sorted(Counter(t[2] for t in tasks).items()))


def _depths(ids: list[uuid.UUID], edges: list[tuple[uuid.UUID, uuid.UUID]]) -> dict[uuid.UUID, int]:
    """The longest way from a task with nothing before it (Kahn's order: edges only go forward)."""
    after: dict[uuid.UUID, list[uuid.UUID]] = defaultdict(list)
    indegree = dict.fromkeys(ids, 0)
    for parent, child in edges:
        after[parent].append(child)
        indegree[child] += 1
    depth = dict.fromkeys(ids, 0)
    todo = [i for i in ids if indegree[i] == 0]
    while todo:
        node = todo.pop()
        for child in after[node]:
            depth[child] = max(depth[child], depth[node] + 1)
            indegree[child] -= 1
            if indegree[child] == 0:
                todo.append(child)
    return depth
