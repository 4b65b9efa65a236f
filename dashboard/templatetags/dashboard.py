"""Formatting for the dashboard: relative times, durations, status badges, pretty JSON."""

import json
from datetime import datetime
from typing import Any

from django import template
from django.utils import timezone
from django.utils.html import format_html

register = template.Library()

BADGES = {
    "PENDING": "pending",
    "READY": "ready",
    "RUNNING": "running",
    "SUCCESSFUL": "ok",
    "FAILED": "failed",
    "CANCELLED": "cancelled",
    "failed": "failed",
    "timed_out": "failed",
    "lost": "lost",
    "cancelled": "cancelled",
    "succeeded": "ok",
    "live": "ok",
    "stale": "failed",
    "stopped": "cancelled",
    "missed": "failed",
    "on_time": "ok",
}


def seconds_text(seconds: float) -> str:
    """A compact span: 850 ms, 4.2 s, 3 min 5 s, 2 h 10 min, 3 d 4 h."""
    seconds = abs(seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs and minutes < 10 else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


@register.filter
def span(seconds: float | None) -> str:
    return "—" if seconds is None else seconds_text(seconds)


@register.filter
def duration(start: datetime | None, end: datetime | None) -> str:
    if not start or not end:
        return "—"
    return seconds_text((end - start).total_seconds())


@register.simple_tag
def relative(moment: datetime | None, now: datetime | None = None) -> str:
    """`<time>` with the exact instant in its title and "5 s ago" / "in 12 s" as its text."""
    if moment is None:
        return "—"
    now = now or timezone.now()
    delta = (now - moment).total_seconds()
    text = "now" if abs(delta) < 0.5 else (f"{seconds_text(delta)} ago" if delta > 0 else f"in {seconds_text(delta)}")
    iso = moment.isoformat(timespec="milliseconds")
    return format_html('<time datetime="{}" title="{}">{}</time>', iso, iso, text)


@register.simple_tag
def age(moment: datetime | None, now: datetime | None = None) -> str:
    if moment is None:
        return "—"
    return seconds_text(((now or timezone.now()) - moment).total_seconds())


@register.filter
def badge(value: str) -> str:
    label = str(value).replace("_", " ").lower()
    return format_html('<span class="badge badge-{}">{}</span>', BADGES.get(str(value), "neutral"), label)


@register.filter
def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


@register.filter
def progress(metadata: Any) -> float | None:
    """A task's `progress` from its metadata (ox.metadata), as a fraction 0..1; None when it
    reports none, or something that is not a finite number in that range."""
    value = metadata.get("progress") if isinstance(metadata, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        return None  # NaN fails the comparison too
    return float(value)


@register.inclusion_tag("dashboard/_progress.html")
def progress_bar(metadata: Any) -> dict[str, Any]:
    stage = metadata.get("stage") if isinstance(metadata, dict) else None
    return {"fraction": progress(metadata), "stage": stage if isinstance(stage, str) else None}


@register.filter
def short_id(value: Any) -> str:
    """The last 12 hex digits: the random tail, unique enough to tell rows apart on screen."""
    return str(value)[-12:]


@register.filter
def percent(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f} %"


@register.filter
def rate(value: float) -> str:
    return f"{value:.1f}" if value < 100 else f"{value:,.0f}"


@register.simple_tag
def capped(value: int, is_capped: bool) -> str:
    """A count that may have stopped at the cap: "10000+" (with a title saying so) when it did."""
    if not is_capped:
        return str(value)
    return format_html('<span title="counted up to {}: there are more">{}+</span>', value, value)
