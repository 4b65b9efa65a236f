"""Who may see the dashboard and who may act on tasks.

Task data (arguments, return values, tracebacks) is for those the admin would show it to:
viewing any page or partial needs an active staff account with ox.view_task (or ox.change_task,
which the admin counts as view too); retry and cancel, and pausing, resuming and limiting a
queue, need ox.change_task, the same permission the admin's actions check (ox.admin's queue
actions included). Actions are POST only (CSRF-checked by the middleware).
"""

from collections.abc import Callable
from functools import wraps

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_POST
from django_htmx.http import HttpResponseClientRedirect

VIEW_TASK = "ox.view_task"
CHANGE_TASK = "ox.change_task"

View = Callable[..., HttpResponse]


def can_view_tasks(request: HttpRequest) -> bool:
    """ModelAdmin.has_view_permission's rule, on a staff account: the dashboard never shows
    what /admin/ox/task/ would refuse."""
    user = request.user
    return bool(user.is_active and user.is_staff and (user.has_perm(VIEW_TASK) or user.has_perm(CHANGE_TASK)))


def can_change_tasks(request: HttpRequest) -> bool:
    return can_view_tasks(request) and request.user.has_perm(CHANGE_TASK)


def _current_path(request: HttpRequest) -> str:
    """The page an htmx request came from (HX-Current-URL), as a local path; "/" when the
    header does not parse (it is the client's to send: "http://[::1" made urlsplit raise)."""
    try:
        return request.htmx.current_url_abs_path or "/"
    except ValueError:
        return "/"


def view_task_required(view: View) -> View:
    @wraps(view)
    def wrapped(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        user = request.user
        if not user.is_authenticated:
            if request.htmx:
                # A poll whose session expired: send the whole page to the login form, not
                # the login form into a table cell.
                login = redirect_to_login(_current_path(request))
                return HttpResponseClientRedirect(login["Location"])
            return redirect_to_login(request.get_full_path())
        if not (user.is_active and user.is_staff):
            raise PermissionDenied("The operations dashboard is for staff.")
        if not can_view_tasks(request):
            raise PermissionDenied("The operations dashboard needs the ox.view_task permission.")
        return view(request, *args, **kwargs)

    return wrapped


def change_task_required(view: View) -> View:
    """POST only, staff with ox.view_task, and ox.change_task."""

    @view_task_required
    @require_POST
    @wraps(view)
    def wrapped(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        if not can_change_tasks(request):
            raise PermissionDenied("Acting on tasks and queues needs the ox.change_task permission.")
        return view(request, *args, **kwargs)

    return wrapped
