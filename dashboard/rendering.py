"""One template per page, its live parts as partials: an htmx request gets just the partial."""

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.cache import add_never_cache_headers, patch_vary_headers


def render_page(request: HttpRequest, template: str, context: dict[str, Any], partial: str) -> HttpResponse:
    wants_partial = bool(request.htmx) and not request.htmx.boosted
    response = render(request, f"{template}#{partial}" if wants_partial else template, context)
    # The same URL answers with a page or a fragment: caches must key on the header, and
    # live numbers must never come from a cache at all.
    patch_vary_headers(response, ("HX-Request",))
    add_never_cache_headers(response)
    return response
