"""Project middleware."""

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, QueryDict


def _has_nul(data: QueryDict) -> bool:
    return any("\x00" in key or any("\x00" in value for value in values) for key, values in data.lists())


class RejectNulCharacters:
    """400 for a path, query string or form that holds a NUL character. No legitimate input has
    one, forms refuse them already, and the admin passes list filter parameters and object ids
    from the path (/admin/ox/worker/%00/change/) straight to the database, where PostgreSQL
    refuses a NUL in a text value with an error (a 500)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        form = request.POST if request.method == "POST" else QueryDict()
        if "\x00" in request.path_info or _has_nul(request.GET) or _has_nul(form):
            return HttpResponseBadRequest("NUL characters are not accepted.", content_type="text/plain")
        return self.get_response(request)
