"""The dashboard's Queues page (pause, resume, run-time limits through ox.flow.queues), the
flow state on the overview and the task page, and the QueueState admin's actions."""

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.urls import reverse

from ox.flow import queues
from ox.models import QueueState, Status
from tests.settings import TASKS
from tests.test_dashboard_support import make_task, operator_fixture, staff_fixture, staff_user  # noqa: F401

pytestmark = pytest.mark.django_db

QUEUES = reverse("dashboard:queues")
HX = {"HX-Request": "true"}


@pytest.fixture
def limits(settings):
    """emails: at most 2 running, from the settings."""
    options = {**TASKS["default"]["OPTIONS"], "LIMITS": {"emails": {"concurrency": 2}}}
    settings.TASKS = {"default": {**TASKS["default"], "OPTIONS": options}}


def row(body: str, queue: str) -> str:
    """The Queues table's row of one queue, as HTML."""
    start = body.index(f'<tr data-queue="{queue}">')
    return body[start : body.index("</tr>", start)]


def stat(row_html: str, name: str) -> str:
    start = row_html.index(f'data-stat="{name}"')
    return row_html[row_html.index(">", start) + 1 : row_html.index("</td>", start)]


def limit_form(body: str, queue: str) -> str:
    """The limit form of one queue, as HTML."""
    start = body.index(f'data-queue="{queue}"', body.index('id="queue-limits"'))
    return body[start : body.index("</form>", start)]


def post(client: Client, name: str, **data: str):
    return client.post(reverse(f"dashboard:{name}"), data)


# The page


def test_lists_state_limits_and_what_waits(client, staff, limits):
    for _ in range(2):
        make_task(Status.RUNNING, queue="emails")
    make_task(queue="emails")
    make_task(queue="emails", run_after=make_task(queue="other").run_after.replace(year=2099))
    queues.set_limits("emails", {"rate": "5/s"}, by="someone")
    queues.pause("reports", by="someone")

    response = client.get(QUEUES)
    assert response.status_code == 200
    body = response.content.decode()
    assert f'href="{QUEUES}" aria-current="page">Queues</a>' in body  # in the nav
    emails = row(body, "emails")
    assert "badge-ok" in stat(emails, "state") and "running" in stat(emails, "state")
    limits_cell = stat(emails, "limits")
    assert 'concurrency 2</span> <span class="muted">settings' in limits_cell
    assert 'rate 5/s</span> <span class="muted">override' in limits_cell
    assert (stat(emails, "running"), stat(emails, "due"), stat(emails, "scheduled")) == ("2/2", "1", "1")
    assert stat(emails, "waiting_on_limit") == "1"  # full: the due task waits on the limit
    assert "at its concurrency limit (2 of 2 running)" in stat(emails, "reasons")
    assert "changed by someone" in stat(emails, "reasons")
    reports = row(body, "reports")
    assert "paused" in stat(reports, "state") and "paused" in stat(reports, "reasons")
    other = row(body, "other")
    assert "no limits" in stat(other, "limits") and stat(other, "due") == "1"
    assert stat(other, "waiting_on_limit") == "0"
    # A viewer sees no buttons and no forms.
    assert 'data-action="pause"' not in body and 'id="queue-limits"' not in body


def test_partial_polls_and_has_no_page(client, staff):
    response = client.get(QUEUES, headers=HX)
    assert response.status_code == 200
    assert b"<html" not in response.content and b'hx-trigger="every 2s"' in response.content
    assert b'<tr data-queue="emails">' in response.content


def test_operator_sees_buttons_and_forms_prefilled_with_the_overrides(client, operator, limits):
    queues.set_limits("emails", {"key_rate": "10/s", "concurrency": None})
    queues.pause("reports")
    body = client.get(QUEUES).content.decode()
    assert 'data-action="pause"' in stat(row(body, "emails"), "state")
    assert 'data-action="resume"' in stat(row(body, "reports"), "state")
    form = limit_form(body, "emails")
    assert 'name="key_rate" value="10/s"' in form and 'name="concurrency" value="none"' in form
    assert 'placeholder="2"' in form  # the settings' concurrency, what an empty field keeps
    # The lifted settings limit shows as lifted, with the settings' value beside it.
    assert 'concurrency none</span> <span class="muted">override, settings 2' in stat(row(body, "emails"), "limits")


# Pause and resume


def test_pause_then_resume_records_who(client, operator):
    response = client.post(reverse("dashboard:pause"), {"queue": "emails"}, follow=True)
    assert [str(m) for m in response.context["messages"]] == ["emails: paused"]
    state = QueueState.objects.get(name="emails")
    assert state.paused and state.updated_by == "operator" and state.updated_at is not None
    assert "paused" in stat(row(response.content.decode(), "emails"), "state")

    response = client.post(reverse("dashboard:resume"), {"queue": "emails"}, follow=True)
    assert [str(m) for m in response.context["messages"]] == ["emails: resumed"]
    assert not QueueState.objects.get(name="emails").paused


@pytest.mark.parametrize("queue", ["nope", "", "x" * 65])
def test_unknown_queue_is_refused(client, operator, queue):
    for name in ("pause", "resume", "limit"):
        assert post(client, name, queue=queue, concurrency="1").status_code == 400
    assert not QueueState.objects.exists()


def test_actions_are_post_only(client, operator):
    for name in ("pause", "resume", "limit"):
        assert client.get(reverse(f"dashboard:{name}"), {"queue": "emails"}).status_code == 405
    assert not QueueState.objects.exists()


def test_actions_check_csrf(operator):
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    assert client.post(reverse("dashboard:pause"), {"queue": "emails"}).status_code == 403
    assert not QueueState.objects.exists()


# Limits


def test_override_keeps_empty_fields_and_lifts_none(client, operator, limits):
    data = {"queue": "emails", "concurrency": "3", "key_concurrency": "", "rate": " 50/s ", "key_rate": "None"}
    response = client.post(reverse("dashboard:limit"), data, follow=True)
    assert [str(m) for m in response.context["messages"]] == ["emails: limits now 3 at a time, 50/s"]
    state = QueueState.objects.get(name="emails")
    assert state.overrides == {"concurrency": 3, "rate": {"count": 50, "period": 1.0, "burst": 1}, "key_rate": None}
    assert state.updated_by == "operator" and state.limited
    limits_cell = stat(row(response.content.decode(), "emails"), "limits")
    assert 'concurrency 3</span> <span class="muted">override, settings 2' in limits_cell


def test_reset_goes_back_to_the_settings(client, operator, limits):
    queues.set_limits("emails", {"concurrency": 5})
    # The fields of the form ride along with the reset button: they are ignored.
    data = {"queue": "emails", "concurrency": "9", "reset": "1"}
    response = client.post(reverse("dashboard:limit"), data, follow=True)
    assert [str(m) for m in response.context["messages"]] == ["emails: limits back to the settings (2 at a time)"]
    state = QueueState.objects.get(name="emails")
    assert state.overrides == {} and not state.limited and state.updated_by == "operator"


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("concurrency", "three", "a whole number, or none to lift the limit"),  # the form's own check
        ("concurrency", "0", "must be an integer from 1 to 100000"),  # set_limits' ValueError
        ("key_concurrency", "100001", "must be an integer from 1 to 100000"),
        ("rate", "fast", "not a rate: &#x27;fast&#x27;"),
        ("key_rate", "0/s", "a rate needs a count &gt;= 1"),
    ],
)
def test_bad_input_shows_the_error_and_writes_nothing(client, operator, field, value, error):
    queues.set_limits("emails", {"concurrency": 4}, by="before")
    response = client.post(reverse("dashboard:limit"), {"queue": "emails", "rate": "10/s", field: value})
    assert response.status_code == 400
    body = response.content.decode()
    assert error in body
    assert f'value="{value}"' in limit_form(body, "emails")  # what was typed is kept
    state = QueueState.objects.get(name="emails")
    assert state.overrides == {"concurrency": 4} and state.updated_by == "before"


def test_bad_input_for_a_queue_without_a_row_creates_none(client, operator):
    response = client.post(reverse("dashboard:limit"), {"queue": "reports", "rate": "1/y"})
    assert response.status_code == 400 and b"not a rate" in response.content
    assert not QueueState.objects.filter(name="reports").exists()


# Permissions


def test_viewer_and_staff_without_permission_cannot_act(client):
    queues.pause("reports", by="before")
    for user, page in ((staff_user("viewer", "view_task"), 200), (staff_user("nobody"), 403)):
        client.force_login(user)
        assert client.get(QUEUES).status_code == page
        assert post(client, "pause", queue="emails").status_code == 403
        assert post(client, "resume", queue="reports").status_code == 403
        assert post(client, "limit", queue="emails", concurrency="1").status_code == 403
        assert post(client, "limit", queue="emails", reset="1").status_code == 403
    assert list(QueueState.objects.values_list("name", "paused", "overrides", "updated_by")) == [
        ("reports", True, {}, "before")
    ]


def test_change_task_alone_may_act(client):
    # As for retry and cancel: ox.change_task counts as view too.
    client.force_login(staff_user("changer", "change_task"))
    assert client.get(QUEUES).status_code == 200
    assert post(client, "pause", queue="emails").status_code == 302
    assert QueueState.objects.get(name="emails").paused


# The overview and the task page


def test_overview_shows_paused_and_full(client, staff, limits):
    for _ in range(2):
        make_task(Status.RUNNING, queue="emails")
    make_task(Status.RUNNING, queue="default")
    queues.pause("reports")
    body = client.get(reverse("dashboard:overview"), headers=HX).content.decode()
    flow = {q: stat(row(body, q), "flow") for q in ("emails", "reports", "default")}
    assert '<span class="bad"' in flow["emails"] and "2/2 running" in flow["emails"]
    assert "paused" in flow["reports"] and "running" not in flow["reports"]
    assert flow["default"] == ""  # neither paused nor limited: nothing to say


def test_overview_not_full_below_the_limit(client, staff, limits):
    make_task(Status.RUNNING, queue="emails")
    flow = stat(row(client.get(reverse("dashboard:overview"), headers=HX).content.decode(), "emails"), "flow")
    assert "1/2 running" in flow and '<span class="muted"' in flow and "paused" not in flow


def test_task_page_says_why_a_ready_task_waits(client, staff, limits):
    task = make_task(queue="emails")
    detail = reverse("dashboard:task", args=[task.pk])
    assert "no pause or limit holds it back" in client.get(detail).content.decode()
    for _ in range(2):
        make_task(Status.RUNNING, queue="emails")
    body = client.get(detail, headers=HX).content.decode()
    assert "queue &#x27;emails&#x27; is at its concurrency limit (2 of 2 running)" in body
    queues.pause("emails")
    assert "queue &#x27;emails&#x27; is paused" in client.get(detail).content.decode()
    # Not READY: no waiting line at all.
    done = make_task(Status.SUCCESSFUL, queue="emails")
    assert 'id="task-waiting"' not in client.get(reverse("dashboard:task", args=[done.pk])).content.decode()


# The admin


@pytest.fixture
def root(client) -> User:
    user = User.objects.create_superuser("root", password="pw")
    client.force_login(user)
    return user


def test_admin_lists_queue_rows(client, root):
    queues.set_limits("emails", {"concurrency": 3}, by="cli")
    queues.pause("reports", by="cli")
    response = client.get(reverse("admin:ox_queuestate_changelist"))
    assert response.status_code == 200
    assert [q.name for q in response.context["cl"].result_list] == ["emails", "reports"]
    body = response.content.decode()
    for header in ("Name", "Paused", "Overrides", "Updated at", "Updated by"):
        assert f">{header}<" in body
    assert "&quot;concurrency&quot;: 3" in body or "{&#x27;concurrency&#x27;: 3}" in body
    assert "pause_queues" in body and "resume_queues" in body and "delete_selected" not in body
    # Rows are changed through the actions only.
    assert client.get(reverse("admin:ox_queuestate_add")).status_code == 403
    change = reverse("admin:ox_queuestate_change", args=["reports"])
    client.post(change, {"name": "reports", "paused": "", "overrides": "{}"})
    assert QueueState.objects.get(name="reports").paused


def test_admin_actions_pause_and_resume_through_ox_flow(client, root, django_capture_on_commit_callbacks):
    queues.resume("emails")
    queues.resume("reports")
    url = reverse("admin:ox_queuestate_changelist")
    with django_capture_on_commit_callbacks() as notified:
        response = client.post(url, {"action": "pause_queues", "_selected_action": ["emails", "reports"]}, follow=True)
    assert [str(m) for m in response.context["messages"]] == ["2 paused: emails, reports."]
    assert list(QueueState.objects.values_list("name", "paused", "updated_by")) == [
        ("emails", True, "root"),
        ("reports", True, "root"),
    ]
    # ox.flow.queues' wake-up of idle workers, once per queue (NOTIFY on PostgreSQL, KILL QUERY
    # on MariaDB; SQLite's workers poll).
    assert len(notified) == (0 if connection.vendor == "sqlite" else 2)

    response = client.post(url, {"action": "resume_queues", "_selected_action": ["reports"]}, follow=True)
    assert [str(m) for m in response.context["messages"]] == ["1 resumed: reports."]
    assert dict(QueueState.objects.values_list("name", "paused")) == {"emails": True, "reports": False}


def test_admin_actions_need_change_task(client):
    queues.resume("emails", by="before")
    url = reverse("admin:ox_queuestate_changelist")
    client.force_login(staff_user("viewer", "view_task"))
    response = client.get(url)
    assert response.status_code == 200 and b"pause_queues" not in response.content
    client.post(url, {"action": "pause_queues", "_selected_action": ["emails"]})
    assert not QueueState.objects.get(name="emails").paused
    client.force_login(staff_user("nobody"))
    assert client.get(url).status_code == 403
    client.force_login(staff_user("operator", "view_task", "change_task"))
    assert b"pause_queues" in client.get(url).content
    client.post(url, {"action": "pause_queues", "_selected_action": ["emails"]})
    assert QueueState.objects.get(name="emails").paused
