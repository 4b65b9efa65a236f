"""The unique key worked out once per task (ox.flow.unique.KeyPlan): it must give exactly the
key unique_key() gives for every call, and the keys rows already hold must not change (a
changed key would let a duplicate of a task enqueued before an upgrade in)."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.tasks import task
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ox.exceptions import ArgumentsNotJSON
from ox.flow.unique import KeyPlan, Unique, unique_key
from ox.jsoncheck import jsonable
from ox.models import Task
from tests import flow_tasks as f

AT = datetime(2026, 12, 2, 6, 0, 30, tzinfo=UTC)

# Keys as the release before KeyPlan computed them (ox.flow.unique.unique_key at 286bfa6).
PINNED = [
    (f.unique_all, (1,), {}, "cdbbc219799a3f54fe47626a8b711153d77d18c33d1d1d381176e1f443034c43"),
    (f.unique_all, (), {"n": 1}, "cdbbc219799a3f54fe47626a8b711153d77d18c33d1d1d381176e1f443034c43"),
    (f.unique_customer, ("acme",), {"note": "x"}, "4b6101a7dd8857e0b696a9e53afd236f302ee294e980ce4fcb09a0ce0aee6dbf"),
    (f.unique_hourly, (7,), {}, "fee5838e1c4503f577dec7dbf5360f685bc2620429645660e78402b43b6ce211"),
    (f.unique_defaults, (), {}, "1783223cc6053444701ede42d98b8b919a747aaef08c3e7fd0482c3633c94fb8"),
    (f.unique_fails_once, (3,), {}, "e125ce5b5aa39240d222020e7e6c0b765e1e37ab008f2e4fd168a89e19b126a3"),
    (
        f.unique_all.using(unique_key="fixed"),
        (1,),
        {},
        "83233d9d14146c976bb38740f158b266de60ae1e49cc9ec8b8432033e0177828",
    ),
    (
        f.unique_all,
        ({"b": [1, 2.5, None], "a": "\u00e9"},),
        {},
        "f7691389044d47734f07f5a70cfbd8d770f04f10509901ffd620c9e8134d7569",
    ),
]


@pytest.mark.parametrize(("t", "args", "kwargs", "key"), PINNED, ids=lambda v: getattr(v, "name", None))
def test_the_plan_gives_the_keys_rows_already_hold(t, args, kwargs, key):
    assert t.unique_plan.key(args, kwargs, AT)[0] == key


@pytest.mark.django_db(transaction=True)
def test_an_enqueued_row_holds_the_pinned_key():
    f.unique_all.enqueue(n=1)
    f.unique_customer.enqueue("acme", note="x")
    held = set(Task.objects.values_list("unique_key", flat=True))
    assert held == {PINNED[0][3], PINNED[2][3]}


@task(unique=True)
def plain(a: Any, b: Any = 2, c: Any = None) -> None:
    """Every parameter positional-or-keyword: the plan's own binding."""


@task(unique=True)
def odd_default(a: Any, at: Any = datetime(2020, 1, 1, tzinfo=UTC)) -> None:
    """A default JSON cannot say: it stands in the key as a marker."""


@task(unique={"period": 60})
def windowed(a: Any, b: Any = 0) -> None:
    pass


@task(unique=True, takes_context=True)
def with_context(context: Any, a: Any, b: Any = 1) -> None:
    pass


@task(unique=True)
def variadic(a: Any, *rest: Any, **more: Any) -> None:
    """Not a plain signature: the plan hands it to unique_key()."""


@task(unique={"by": ["b"]})
def by_name(a: Any, b: Any = 5) -> None:
    pass


TASKS = [plain, odd_default, windowed, with_context, variadic, by_name, f.unique_defaults, f.unique_customer]
NAMES = ["a", "b", "c", "at", "n", "label", "customer", "note", "rest", "zz"]
values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(TASKS),
    st.lists(values, max_size=4),
    st.dictionaries(st.sampled_from(NAMES), values, max_size=4),
    st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)),
)
def test_the_plan_gives_what_unique_key_gives_for_any_call(t, args, kwargs, now):
    """Calls that fit the signature and calls that do not (extra, missing, repeated
    arguments): the plan's key and the general one agree, or both refuse alike."""
    try:
        args, kwargs = jsonable(args, "args"), jsonable(kwargs, "kwargs")
    except ArgumentsNotJSON:
        assume(False)  # refused at enqueue (a NUL character, say): no key is ever made
    try:
        want: Any = unique_key(t.unique, t, args, kwargs, now)
    except Exception as error:  # noqa: BLE001  (by= on a call without the argument)
        want = type(error), str(error)
    try:
        got: Any = t.unique_plan.key(args, kwargs, now)
    except Exception as error:  # noqa: BLE001
        got = type(error), str(error)
    assert got == want


def test_using_builds_the_plan_of_the_new_task():
    fixed = f.unique_all.using(unique_key="fixed")
    assert fixed.unique_plan.key((1,), {}, AT) == fixed.unique_plan.key((2,), {}, AT)
    assert f.unique_all.unique_plan.key((1,), {}, AT) != f.unique_all.unique_plan.key((2,), {}, AT)
    assert f.unique_all.using(unique=False).unique_plan is None
    moved = f.unique_all.using(priority=5, queue_name="emails")
    assert moved.unique_plan is not f.unique_all.unique_plan
    assert moved.unique_plan.key((1,), {}, AT) == f.unique_all.unique_plan.key((1,), {}, AT)
    hourly = f.unique_all.using(unique={"period": timedelta(hours=1)})
    key, until = hourly.unique_plan.key((1,), {}, AT)
    assert until == datetime(2026, 12, 2, 7, tzinfo=UTC)
    assert (key, until) == unique_key(hourly.unique, hourly, (1,), {}, AT)


def test_a_plain_task_has_no_plan_and_the_plan_keeps_the_task_states():
    assert f.limited.unique_plan is None
    assert f.unique_ever.unique_plan.hold_bits == Unique(states=("SUCCESSFUL",)).hold_bits == 1
    assert KeyPlan(Unique(), plain).key((1,), {}, AT) == unique_key(Unique(), plain, (1,), {}, AT)
