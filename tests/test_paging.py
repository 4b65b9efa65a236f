"""ox.paging on every database: a page past the first is the same rows, in the same order,
as a plain slice of the list (the admin's and the dashboard's task lists). Found by review:
on MariaDB any page after the first failed ("LIMIT & IN/ALL/ANY/SOME subquery")."""

import pytest
from django.contrib.auth import get_user_model

from ox.models import ArchivedTask, Task
from ox.paging import CappedPaginator, NewestFirst
from tests import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def many() -> list:
    return [tasks.echo.enqueue(n).id for n in range(23)]


@pytest.mark.parametrize("number", [1, 2, 3])
def test_each_page_is_the_plain_slice(many, number):
    rows = Task.objects.order_by("-id")
    paginator = CappedPaginator(rows, 10)
    page = paginator.page(number)
    assert paginator.count == 23
    assert [t.pk for t in page.object_list] == [t.pk for t in rows[(number - 1) * 10 : number * 10]]


def test_a_filtered_later_page(many):
    rows = Task.objects.filter(pk__in=many[:15]).order_by("-id")
    page = CappedPaginator(rows, 10).page(2)
    assert [t.pk for t in page.object_list] == [t.pk for t in rows[10:15]]


def test_newest_first_over_tasks_and_archive_pages(many):
    paginator = CappedPaginator(NewestFirst(Task.objects.all(), ArchivedTask.objects.all()), 10)
    seen = [t.pk for n in (1, 2, 3) for t in paginator.page(n).object_list]
    assert seen == list(Task.objects.order_by("-id").values_list("pk", flat=True))


def test_the_admins_second_page(many, client):
    more = [tasks.echo.enqueue(n).id for n in range(35)]  # 58 in all: two pages of 50
    user = get_user_model().objects.create_superuser("pager", "p@example.com", "pw-pager-1")
    client.force_login(user)
    first = client.get("/admin/ox/task/")
    second = client.get("/admin/ox/task/?p=2")
    assert first.status_code == 200 and second.status_code == 200
    oldest, newest = str(many[0]), str(more[-1])  # ids are time-ordered; the list is newest first
    assert newest in first.content.decode() and oldest not in first.content.decode()
    assert oldest in second.content.decode() and newest not in second.content.decode()
