"""The Queues page's limit form: what an operator types, turned into set_limits()' overrides.

An empty field keeps the settings' value (no override for that field); "none" lifts the limit
(an override of None); anything else is an override, checked by ox.flow.queues.set_limits,
whose ValueError the view shows as the form's error (nothing is written then)."""

from typing import Any

from django import forms

from ox.flow.limits import LIMIT_FIELDS, parse_rate

NONE_WORDS = frozenset({"none", "null"})
COUNT_FIELDS = ("concurrency", "key_concurrency")


class LimitForm(forms.Form):
    queue = forms.CharField(max_length=64, widget=forms.HiddenInput)
    concurrency = forms.CharField(required=False, max_length=16, help_text="tasks at a time")
    key_concurrency = forms.CharField(required=False, max_length=16, help_text="per key at a time")
    rate = forms.CharField(required=False, max_length=32, help_text="e.g. 50/s, 10/m, 5/10s")
    key_rate = forms.CharField(required=False, max_length=32, help_text="per key, e.g. 10/s")

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        for name in COUNT_FIELDS:
            raw = (data.get(name) or "").strip()
            if raw and raw.lower() not in NONE_WORDS:
                try:
                    int(raw)
                except ValueError:
                    self.add_error(name, f"a whole number, or none to lift the limit (got {raw!r})")
        return data

    def overrides(self) -> dict[str, Any]:
        """The set_limits() argument: only the fields filled in (call after is_valid())."""
        out: dict[str, Any] = {}
        for name in LIMIT_FIELDS:
            raw = (self.cleaned_data.get(name) or "").strip()
            if not raw:
                continue
            if raw.lower() in NONE_WORDS:
                out[name] = None
            else:
                out[name] = int(raw) if name in COUNT_FIELDS else raw
        return out


def initial_for(name: str, overrides: dict[str, Any]) -> dict[str, str]:
    """The form prefilled with the overrides in force, so that a submit changing one field
    keeps the others (set_limits replaces the whole set of overrides)."""
    initial = {"queue": name}
    for field in LIMIT_FIELDS:
        if field in overrides:
            value = overrides[field]
            initial[field] = "none" if value is None else _as_text(field, value)
    return initial


def _as_text(field: str, value: Any) -> str:
    """Rates are stored exactly (a dict); the form shows the text that parses back."""
    if field in COUNT_FIELDS:
        return str(value)
    try:
        return str(parse_rate(value))
    except ValueError:
        return str(value)
