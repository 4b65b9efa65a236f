"""Queues' run-time state (ox_queue): pause and resume, limits overridden at run time, and
what a worker reads of them. The claim itself enforces a pause (ox.sql skips paused queues
in the same statement), so a pause holds from the next claim of every worker, with or
without a listener; a resume and a change of limits NOTIFY idle workers on PostgreSQL."""

import json
from dataclasses import dataclass
from typing import Any

from django.db import connections, router, transaction
from django.utils import timezone

from ox.db import driver
from ox.flow.limits import LIMIT_FIELDS, QueueLimits, merged, parse_limits, stored
from ox.models import KeyRate, QueueState


@dataclass(frozen=True, slots=True)
class QueueView:
    name: str
    paused: bool
    limits: QueueLimits  # in force: the settings with the overrides on top
    settings: QueueLimits  # TASKS[...]["OPTIONS"]["LIMITS"] alone
    overrides: dict[str, Any]
    rate_tat: float | None = None  # the queue rate's GCRA schedule (epoch seconds)


def _db(using: str | None) -> str:
    return using or router.db_for_write(QueueState)


def _notify(using: str, name: str) -> None:
    """Wake idle PostgreSQL workers of the queue (the enqueue trigger's channel), after
    commit, so what they read is the new state."""
    if not driver(connections[using]).notifies:
        return

    def send() -> None:
        with connections[using].cursor() as cursor:
            driver(connections[using]).notify_state(cursor, name)

    transaction.on_commit(send, using=using)


def _write(name: str, using: str | None, by: str, **changes: Any) -> QueueState:
    db = _db(using)
    with transaction.atomic(using=db):
        state, _created = QueueState.objects.using(db).select_for_update().get_or_create(name=name)
        for field, value in changes.items():
            setattr(state, field, value)
        state.updated_at, state.updated_by = timezone.now(), by[:150]
        state.save(using=db)
        _notify(db, name)
    return state


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not name or len(name) > 64:
        raise ValueError(f"a queue name is a string of 1 to 64 characters, got {name!r}")
    return name


def pause(name: str, using: str | None = None, by: str = "") -> QueueState:
    """No worker claims from the queue from its next claim on; running tasks finish."""
    return _write(check_name(name), using, by, paused=True)


def resume(name: str, using: str | None = None, by: str = "") -> QueueState:
    return _write(check_name(name), using, by, paused=False)


def set_limits(name: str, overrides: dict[str, Any], using: str | None = None, by: str = "") -> QueueState:
    """Override limits at run time: a field given wins over the settings (None lifts that
    limit); {} goes back to the settings. Raises ValueError for a bad value, writing nothing."""
    unknown = sorted(str(k) for k in overrides if k not in LIMIT_FIELDS)
    if unknown:
        raise ValueError(f"unknown limit {', '.join(unknown)} (known: {', '.join(LIMIT_FIELDS)})")
    parsed = parse_limits({k: v for k, v in overrides.items()}, where=f"queue {name!r}")
    clean = stored(parsed, overrides)
    limited = any(v is not None for v in clean.values())
    db = _db(using)
    # A rate changed at run time holds from now: the schedules made under the old one (an
    # hour ahead, for 1/h) are dropped. (A rate changed in the settings holds within one
    # interval of the new rate: ox.flow.limits clamps a schedule too far ahead.) {} resets both.
    with transaction.atomic(using=db):
        row = QueueState.objects.using(db).select_for_update().filter(name=name).first()
        old = dict(row.overrides) if row is not None and isinstance(row.overrides, dict) else {}
        # Only a rate that changes starts afresh: re-saving the same rate with another field
        # (the dashboard's form carries every override in force) must not grant a start.
        changed = {f for f in ("rate", "key_rate") if old.get(f) != clean.get(f)}
        fresh = {"rate_tat": None} if "rate" in changed else {}
        state = _write(check_name(name), db, by, overrides=clean, limited=limited, **fresh)
        if "key_rate" in changed:
            KeyRate.objects.using(db).filter(queue=name).delete()
    return state


def views(settings: dict[str, QueueLimits], names: list[str], using: str | None = None) -> list[QueueView]:
    """Each queue's state: those named, those with limits in the settings, and those with a
    row (paused or overridden), by name."""
    db = _db(using)
    rows = {r.name: r for r in QueueState.objects.using(db).all()}
    out = []
    for name in sorted({*names, *settings, *rows}):
        row = rows.get(name)
        base = settings.get(name, QueueLimits())
        overrides = dict(row.overrides) if row and isinstance(row.overrides, dict) else {}
        tat = row.rate_tat if row is not None else None
        out.append(QueueView(name, bool(row and row.paused), merged(base, overrides), base, overrides, tat))
    return out


def read_states(conn: Any, names: list[str]) -> dict[str, tuple[bool, dict[str, Any], bool]]:
    """The worker's read of its queues' rows on its own connection: name -> (paused,
    overrides, limited). Queues without a row are absent."""
    if not names:
        return {}
    marks = ", ".join(["%s"] * len(names))
    with conn.cursor() as cursor:
        cursor.execute(f"SELECT name, paused, overrides, limited FROM ox_queue WHERE name IN ({marks})", list(names))
        rows = cursor.fetchall()
    out = {}
    for name, paused, overrides, limited in rows:
        if isinstance(overrides, str):
            try:
                overrides = json.loads(overrides)
            except ValueError:
                overrides = {}
        out[name] = (bool(paused), overrides if isinstance(overrides, dict) else {}, bool(limited))
    return out
