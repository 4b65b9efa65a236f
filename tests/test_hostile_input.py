"""No 500 from hostile input (issue #16), and actions validated before they act.

The regressions from the issue first, then Hypothesis throwing made-up parameters, values,
headers and paths at every dashboard, admin, metrics and login endpoint, as GET and POST, logged
in and not: whatever comes in, the answer is a page, a form error, a redirect, a 4xx, never a
500. The test client re-raises a view's exception, so a crash fails the test with its traceback.
OX_FUZZ_EXAMPLES sets the examples per endpoint group (default 40)."""

import os
import re
import uuid
from urllib.parse import quote

import pytest
from django.test import Client
from django.urls import reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ox.models import Status, Task
from tests.test_dashboard_support import make_task, operator_fixture, staff_user  # noqa: F401

pytestmark = pytest.mark.django_db

TASKS = reverse("dashboard:tasks")
RETRY_MATCHING = reverse("dashboard:retry_matching")


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


# ---------------------------------------------------------------- the cases


@pytest.mark.parametrize(
    "params",
    [
        {"enqueued_after": "0001-01-01T00:00"},
        {"enqueued_before": "9999-12-31T23:59"},
        {"enqueued_after": "0001-01-01T00:00", "enqueued_before": "9999-12-31T23:59"},
    ],
)
def test_the_calendars_ends_are_bounds_not_overflows(client, operator, params):
    failed = make_task(Status.FAILED)
    # Everything lies between year 1 and year 9999: the filter matches every task.
    listed = client.get(TASKS, params)
    assert listed.status_code == 200 and [t.pk for t in listed.context["page"].object_list] == [failed.pk]
    assert client.get(TASKS, params, headers={"HX-Request": "true"}).status_code == 200
    confirm = client.get(RETRY_MATCHING, params)
    assert confirm.status_code == 200 and confirm.context["count"] == 1
    done = client.post(RETRY_MATCHING, {**params, "expected": "1"}, follow=True)
    assert messages_of(done) == ["1 retried"]


@pytest.mark.parametrize("expected", ["²", "-1", "1.5", "lots", "9" * 400])
def test_a_bad_confirmation_is_a_form_error_and_nothing_is_retried(client, operator, expected):
    # Issue #16: expected=² passed isdigit(), the retry committed, then int() raised: a 500 for
    # an action that had happened.
    task = make_task(Status.FAILED)
    response = client.post(RETRY_MATCHING, {"status": "FAILED", "expected": expected})
    assert response.status_code == 400 and b"This filter is not valid" in response.content
    assert b"expected" in response.content
    assert Task.objects.get(pk=task.pk).status == Status.FAILED


def hidden_inputs(body: str) -> list[tuple[str, str]]:
    """The hidden inputs of the confirmation form (not the header's log-out form)."""
    form = re.search(rf'<form method="post" action="{RETRY_MATCHING}">(.*?)</form>', body, re.S).group(1)
    return re.findall(r'<input type="hidden" name="([^"]*)" value="([^"]*)"', form)


def test_the_confirmation_carries_only_the_filters_own_fields(client, operator):
    # Issue #8: every query parameter was copied into hidden inputs, csrfmiddlewaretoken too,
    # so a crafted link broke (or steered) the confirmation form.
    for _ in range(2):
        make_task(Status.FAILED, queue="emails")
    crafted = {
        "queue": "emails",
        "csrfmiddlewaretoken": "attacker-chosen",
        "expected": "999",
        "next": "https://evil.example/",
        "action": "cancel",
    }
    body = client.get(RETRY_MATCHING, crafted).content.decode()
    fields = hidden_inputs(body)
    names = [name for name, _ in fields]
    assert sorted(names) == ["csrfmiddlewaretoken", "expected", "queue"], fields
    assert dict(fields)["queue"] == "emails" and dict(fields)["expected"] == "2"
    assert dict(fields)["csrfmiddlewaretoken"] != "attacker-chosen"
    assert "evil.example" not in body and "attacker-chosen" not in body
    back = re.search(r'<a class="button" href="([^"]*)">Back</a>', body).group(1)
    assert back == f"{TASKS}?queue=emails"


def test_the_confirmation_form_posts_back_with_csrf_enforced(operator):
    make_task(Status.FAILED, queue="emails")
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(operator)
    body = strict.get(RETRY_MATCHING, {"queue": "emails", "csrfmiddlewaretoken": "attacker-chosen"}).content.decode()
    response = strict.post(RETRY_MATCHING, dict(hidden_inputs(body)), follow=True)
    assert messages_of(response) == ["1 retried"]
    assert response.redirect_chain[-1][0] == f"{TASKS}?queue=emails"


def test_nul_characters_are_refused_before_any_view(client, operator):
    make_task(Status.FAILED)
    for path, params in [
        (TASKS, {"queue": "a\x00b"}),
        ("/admin/ox/task/", {"status__exact": "FAILED\x00"}),
        ("/admin/ox/task/", {"queue": "\x00"}),
        ("/admin/ox/task/", {"q": "demo\x00"}),
    ]:
        assert client.get(path, params).status_code == 400, (path, params)
    assert client.post(RETRY_MATCHING, {"queue": "\x00"}).status_code == 400
    assert client.get("/admin/ox/worker/%00/change/").status_code == 400  # an object id in the path
    assert Task.objects.filter(status=Status.FAILED).count() == 1


# ---------------------------------------------------------------- fuzz

EXAMPLES = int(os.environ.get("OX_FUZZ_EXAMPLES", "40"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,  # no .hypothesis/ folder in the work tree; a failure prints its example
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

TRICKY = [
    "",
    " ",
    "0",
    "-1",
    "1e309",
    "NaN",
    "inf",
    "9" * 40,
    "²",
    "٣",
    "\x00",
    "null",
    "[]",
    "{}",
    "'",
    '"',
    "\\",
    "%00",
    "<script>alert(1)</script>",
    "../../etc/passwd",
    "//evil.example/",
    "https://evil.example/",
    "http://[::1",
    "javascript:alert(1)",
    "0001-01-01T00:00",
    "9999-12-31T23:59",
    "10000-01-01T00:00",
    "2026-02-30T10:00",
    "2026-01-01T24:00",
    "2026-01-01",
    "READY",
    "FAILED",
    "CANCELLED",
    "retry",
    "cancel",
    "retry_tasks",  # the admin's actions
    "cancel_tasks",
    "delete_selected",
    "x" * 3000,
    "00000000-0000-0000-0000-000000000000",
    "ffffffff-ffff-ffff-ffff-ffffffffffff",
    "🙂",
    "\u202e",
    "\r\nSet-Cookie: x=1",
]
# Text a client can send: any character but lone surrogates (which no URL or form can carry).
TEXT = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=30)
VALUE = st.one_of(
    st.sampled_from(TRICKY),
    TEXT,
    st.integers().map(str),
    st.floats().map(str),
    st.datetimes().map(lambda d: d.strftime("%Y-%m-%dT%H:%M")),
    st.uuids().map(str),
)


def params(*known: str):
    """A query or form: known names (and a few made up), each with one to three values."""
    name = st.one_of(st.sampled_from(known), TEXT.filter(bool)) if known else TEXT.filter(bool)
    return st.dictionaries(name, st.lists(VALUE, min_size=1, max_size=3), max_size=6)


FILTER = ("status", "queue", "task", "enqueued_after", "enqueued_before", "id", "page")
GET_ENDPOINTS = {
    "/": ("x",),
    TASKS: FILTER,
    RETRY_MATCHING: (*FILTER, "expected", "csrfmiddlewaretoken", "next"),
    "/running/": ("x",),
    "/workers/": ("x",),
    "/health/": ("part",),
    "/benchmarks/": ("x",),
    "/ox/metrics": ("x",),
    "/admin/": ("x",),
    "/admin/ox/task/": ("q", "status__exact", "queue", "enqueued", "o", "p", "all", "e", "_to_field", "_popup"),
    "/admin/ox/worker/": ("q", "host", "o", "p", "all"),
    "/admin/ox/attempt/": ("q",),
    "/accounts/login/": ("next",),
}


def ok(response) -> None:
    assert response.status_code < 500, response.status_code


@pytest.fixture
def seeded():
    """A few tasks in every state, for the endpoints to find."""
    rows = [make_task(status) for status in Status.values]
    make_task(Status.FAILED, queue="emails", path="tests.tasks.always_fails")
    return rows


@given(endpoint=st.sampled_from(sorted(GET_ENDPOINTS)), data=st.data(), htmx=st.booleans())
@FUZZ
def test_fuzz_every_get_endpoint(client, operator, seeded, endpoint, data, htmx):
    query = data.draw(params(*GET_ENDPOINTS[endpoint]))
    headers = {"HX-Request": "true"} if htmx else {}
    ok(client.get(endpoint, query, headers=headers))


@given(
    query=params(*FILTER),
    current=st.one_of(st.sampled_from(TRICKY), TEXT),
    endpoint=st.sampled_from(sorted(GET_ENDPOINTS)),
)
@FUZZ
def test_fuzz_anonymous_polls_and_pages(client, seeded, query, current, endpoint):
    # An expired session's poll redirects the whole page to the login form, from HX-Current-URL.
    ok(client.get(endpoint, query, headers={"HX-Request": "true", "HX-Current-URL": current}))
    ok(client.get(endpoint, query))


@given(segment=st.one_of(st.sampled_from(TRICKY), TEXT, st.uuids().map(str)), tail=st.sampled_from(["", "change/"]))
@FUZZ
def test_fuzz_object_paths(client, operator, seeded, segment, tail):
    quoted = quote(segment, safe="")
    ok(client.get(f"/tasks/{quoted}/"))
    ok(client.get(f"/admin/ox/task/{quoted}/{tail}"))
    ok(client.get(f"/admin/ox/worker/{quoted}/{tail}"))


@given(
    endpoint=st.sampled_from(["bulk", "retry_matching", "retry", "cancel", "admin_action"]),
    form=params("action", "ids", "next", "expected", *FILTER, "_selected_action", "select_across", "index"),
)
@FUZZ
def test_fuzz_every_action(client, operator, seeded, endpoint, form):
    task = seeded[0]
    path = {
        "bulk": reverse("dashboard:bulk"),
        "retry_matching": RETRY_MATCHING,
        "retry": reverse("dashboard:retry", args=[task.pk]),
        "cancel": reverse("dashboard:cancel", args=[task.pk]),
        "admin_action": "/admin/ox/task/",
    }[endpoint]
    ok(client.post(path, form))


@given(
    action=st.one_of(st.sampled_from(["retry_tasks", "cancel_tasks", "delete_selected"]), VALUE),
    selected=st.lists(st.one_of(st.uuids().map(str), VALUE), max_size=4),
    extra=params("select_across", "index", "q", "status__exact", "queue"),
)
@FUZZ
def test_fuzz_admin_actions(client, operator, seeded, action, selected, extra):
    ok(client.post("/admin/ox/task/", {**extra, "action": action, "_selected_action": selected}))


@given(
    form=params("username", "password", "next", "this_is_the_login_form"),
    target=st.sampled_from(["/accounts/login/", "/admin/login/"]),
)
@FUZZ
def test_fuzz_login_forms(client, target, form):
    ok(client.post(target, form, REMOTE_ADDR="203.0.113.9"))


@given(authorization=st.one_of(st.sampled_from(["Bearer", "Bearer ", "Basic x", "bearer \x00"]), TEXT))
@FUZZ
def test_fuzz_metrics_credentials(client, authorization):
    ok(client.get("/ox/metrics", headers={"Authorization": authorization}))


def test_the_fuzz_can_see_a_500(client, operator):
    # The harness itself: a view that raises is a failure here, not a pass (the client re-raises).
    from django.test import override_settings
    from django.urls import path

    def boom(request):
        raise ValueError("a crash the fuzz must see")

    urlconf = type("urls", (), {"urlpatterns": [path("boom/", boom)]})
    with override_settings(ROOT_URLCONF=urlconf), pytest.raises(ValueError, match="the fuzz must see"):
        ok(client.get("/boom/"))
    lenient = Client(raise_request_exception=False)
    with override_settings(ROOT_URLCONF=urlconf), pytest.raises(AssertionError):
        ok(lenient.get("/boom/"))


def test_unknown_uuid_paths_are_404s(client, operator):
    assert client.get(f"/tasks/{uuid.uuid4()}/").status_code == 404


@pytest.mark.parametrize("selected", [["not-a-uuid"], ["\u202e"], [""], ["1" * 50]])
@pytest.mark.parametrize("action", ["retry_tasks", "cancel_tasks", "delete_selected"])
def test_admin_actions_with_bad_selections(client, operator, action, selected):
    task = make_task(Status.FAILED)
    response = client.post("/admin/ox/task/", {"action": action, "_selected_action": selected, "index": "0"})
    assert response.status_code < 500
    assert Task.objects.get(pk=task.pk).status == Status.FAILED
