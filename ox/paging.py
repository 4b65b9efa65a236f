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
        # Same filter and order inside and out: the outer query sorts just this page's rows.
        return self._get_page(rows.filter(pk__in=rows.values("pk")[bottom:top]), number, self)
