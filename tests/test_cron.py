"""ox.cron: the five fields, ranges, steps, lists, names, shorthands, and the day rule."""

from datetime import datetime

import pytest

from ox.cron import Cron, CronError


def test_fields_ranges_steps_lists_and_names():
    c = Cron.parse("*/15 9-17 1,15 jan-mar MON-FRI")
    assert c.minutes == {0, 15, 30, 45}
    assert c.hours == set(range(9, 18))
    assert c.days == {1, 15} and c.months == {1, 2, 3} and c.weekdays == {1, 2, 3, 4, 5}
    assert Cron.parse("5/20 * * * *").minutes == {5, 25, 45}
    assert Cron.parse("0 0 * * 7").weekdays == {0}  # 7 is Sunday too
    assert Cron.parse("0 0 * * sun,sat").weekdays == {0, 6}


def test_shorthands():
    assert Cron.parse("@hourly").minutes == {0}
    assert Cron.parse("@daily").next(datetime(2026, 5, 1, 10, 0)) == datetime(2026, 5, 2, 0, 0)
    assert Cron.parse("@weekly").next(datetime(2026, 5, 1, 10, 0)) == datetime(2026, 5, 3, 0, 0)  # a Sunday


def test_previous_is_inclusive_and_next_is_strict():
    c = Cron.parse("30 * * * *")
    at = datetime(2026, 5, 1, 10, 30, 45)
    assert c.previous(at) == datetime(2026, 5, 1, 10, 30)
    assert c.next(datetime(2026, 5, 1, 10, 30)) == datetime(2026, 5, 1, 11, 30)
    assert c.previous(datetime(2026, 5, 1, 10, 29)) == datetime(2026, 5, 1, 9, 30)


def test_day_of_month_or_day_of_week_when_both_are_restricted():
    c = Cron.parse("0 0 13 * 5")  # the 13th, or any Friday
    assert c.next(datetime(2026, 2, 1)) == datetime(2026, 2, 6)  # a Friday before the 13th
    only_fridays_the_13th_month = Cron.parse("0 0 13 * *")
    assert only_fridays_the_13th_month.next(datetime(2026, 2, 1)) == datetime(2026, 2, 13)


def test_leap_day_is_found_years_away():
    assert Cron.parse("0 0 29 2 *").next(datetime(2026, 3, 1)) == datetime(2028, 2, 29)
    assert Cron.parse("0 12 29 2 *").previous(datetime(2026, 3, 1)) == datetime(2024, 2, 29, 12)


@pytest.mark.parametrize(
    "expression",
    [
        "* * * *",
        "60 * * * *",
        "* 24 * * *",
        "* * 0 * *",
        "* * * 13 *",
        "* * * * 8",
        "*/0 * * * *",
        "5-1 * * * *",
        "a * * * *",
        "1,,2 * * * *",
        "0 0 30 2 *",
        "0 0 31 4,6,9,11 *",
        42,
    ],
)
def test_invalid_expressions(expression):
    with pytest.raises(CronError):
        Cron.parse(expression)
