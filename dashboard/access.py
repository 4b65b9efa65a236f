"""Who may see the dashboard and who may act on tasks.

Viewing needs an active staff account; retry and cancel also need the ox.change_task
permission, the same one the admin's actions check. Actions are POST only (CSRF-checked by
the middleware).
"""

from collections.abc import Callable
from functools import wraps

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_POST
from django_htmx.http import HttpResponseClientRedirect

CHANGE_TASK = "ox.change_task"

View = Callable[..., HttpResponse]


def staff_required(view: View) -> View:
    @wraps(view)
    def wrapped(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        user = request.user
        if not user.is_authenticated:
            if request.htmx:
                # A poll whose session expired: send the whole page to the login form, not
                # the login form into a table cell.
                login = redirect_to_login(request.htmx.current_url_abs_path or "/")
                return HttpResponseClientRedirect(login["Location"])
            return redirect_to_login(request.get_full_path())
        if not (user.is_active and user.is_staff):
            raise PermissionDenied("The operations dashboard is for staff.")
        return view(request, *args, **kwargs)

    return wrapped


def can_change_tasks(request: HttpRequest) -> bool:
    return request.user.has_perm(CHANGE_TASK)


def change_task_required(view: View) -> View:
    """POST only, staff, and ox.change_task."""

    @staff_required
    @require_POST
    @wraps(view)
    def wrapped(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        if not can_change_tasks(request):
            raise PermissionDenied("Retry and cancel need the ox.change_task permission.")
        return view(request, *args, **kwargs)

    return wrapped
