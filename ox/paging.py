"""A paginator that counts at most `cap` rows, for lists over the whole task table (the
dashboard's and the admin's): an exact COUNT(*) over millions of finished tasks costs more than
the page itself. Past the cap a list says "more than 10000"; narrow the filter."""

from functools import cached_property
from typing import Any

from django.core.paginator import Paginator

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
