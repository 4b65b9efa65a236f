"""A paginator that counts at most `cap` rows, for lists over the whole task table (the
dashboard's and the admin's): an exact COUNT(*) over millions of finished tasks costs more than
the page itself. Past the cap a list says "more than 10000"; narrow the filter.

Pages past the first are read as a "deferred join": the ids of the page first (an OFFSET over
ids, which an index holds, so PostgreSQL can skip the offset's rows without reading their heap
tuples), then the page's rows by primary key. A plain OFFSET fetches every skipped row: page
100 of a queue's READY tasks read 100,000 heap tuples."""

from functools import cached_property
from typing import Any

from django.core.paginator import Page, Paginator
from django.db import connections
from django.db.models import QuerySet

COUNT_CAP = 10_000


class CappedPaginator(Paginator):
    def __init__(
        self,
        object_list: Any,
        per_page: int,
        orphans: int = 0,
        allow_empty_first_page: bool = True,
        cap: int = COUNT_CAP,
    ) -> None:
        super().__init__(object_list, per_page, orphans, allow_empty_first_page)
        self.cap = cap

    @cached_property
    def count(self) -> int:
        if isinstance(self.object_list, NewestFirst):
            return self.object_list.capped_count(self.cap)
        # Unordered: the planner may then count from whichever index fits the filter.
        return self.object_list.order_by()[: self.cap + 1].count()

    @property
    def capped(self) -> bool:
        return self.count > self.cap

    def page(self, number: Any) -> Page:
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        if number == 1 or not isinstance(self.object_list, QuerySet):
            return super().page(number)
        top = bottom + self.per_page
        if top + self.orphans >= self.count:
            top = self.count
        rows = self.object_list
        ids: Any = rows.values("pk")[bottom:top]
        if not connections[rows.db].features.allow_sliced_subqueries_with_in:
            # MariaDB/MySQL take no LIMIT in an IN subquery: the page's ids first, one more
            # round trip, still read from an index.
            ids = list(ids.values_list("pk", flat=True))
        # Same filter and order inside and out: the outer query sorts just this page's rows.
        return self._get_page(rows.filter(pk__in=ids), number, self)


class NewestFirst:
    """Querysets of tables with the same columns and a time-ordered primary key `id` (ox_task
    and ox_task_archive, filtered alike) as one list, newest first, that CappedPaginator pages.
    Rows come back as instances of the first part's model.

    Each read is one UNION ALL of the parts, so it sees one snapshot (a row moving between the
    tables is in exactly one of them). On PostgreSQL each part is its own `ORDER BY id DESC
    LIMIT n` (n: the end of the page, or the count's cap), the very query the list ran over one
    table, so each part reads the index it read before and stops; the union then merges at
    most n rows of each. Pages past the first are read as CappedPaginator reads them: the
    page's ids first (an OFFSET over ids, from indexes), then those rows by primary key. SQLite
    allows no LIMIT inside a UNION: there the parts are merged whole (development sizes)."""

    def __init__(self, *parts: QuerySet) -> None:
        self.parts = [part.order_by() for part in parts]

    def _union(self, parts: list[QuerySet], top: int | None = None, newest: bool = True) -> QuerySet:
        if top is not None and connections[parts[0].db].features.supports_slicing_ordering_in_compound:
            parts = [(part.order_by("-pk") if newest else part)[:top] for part in parts]
        first, *rest = parts
        return first.union(*rest, all=True)

    def _ids(self) -> list[QuerySet]:
        return [part.values_list("pk", flat=True) for part in self.parts]

    def capped_count(self, cap: int) -> int:
        # Unordered, as CappedPaginator counts: each part from whichever index fits its filter.
        return self._union(self._ids(), cap + 1, newest=False)[: cap + 1].count()

    def __getitem__(self, window: slice) -> list[Any]:
        if window.stop is not None and window.stop <= (window.start or 0):
            return []  # an empty page (nothing matches): a LIMIT 0 part would be an EmptyQuerySet
        if not window.start:
            return list(self._union(self.parts, window.stop).order_by("-id")[window])
        ids = list(self._union(self._ids(), window.stop).order_by("-id")[window])
        if not ids:
            return []
        found = {row.pk: row for row in self._union([part.filter(pk__in=ids) for part in self.parts])}
        return [found[pk] for pk in ids if pk in found]
