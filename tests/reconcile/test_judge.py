"""
What a reconcile read's answer says about when to read again (reconcile/judge.py `retry_after_of`):
a Retry-After in seconds or as an HTTP date, bounded. Failed reads through a real proxy and the CLI:
tests/e2e/reconcile/test_failed_reads.py.
"""

from __future__ import annotations

import datetime as dt
import email.utils

import pytest

from proxy_addon.reconcile.judge import retry_after_of

NOW = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    "value, expected",
    [
        ("120", NOW + dt.timedelta(seconds=120)),
        (" 0 ", NOW),
        (email.utils.format_datetime(NOW + dt.timedelta(minutes=5), usegmt=True), NOW + dt.timedelta(minutes=5)),
        ("Sun, 01 Mar 2026 11:00:00 GMT", NOW - dt.timedelta(hours=1)),  # a past date: the caller waits its minimum
        ("99999999999999999999", NOW + dt.timedelta(seconds=10**8)),  # bounded, never an overflow
        ("-5", None),
        ("soon", None),
        ("1.5", None),
        ("", None),
        ("٣", None),
    ],
)
def test_retry_after_is_seconds_or_an_http_date(value, expected):
    assert retry_after_of({"retry-after": value}, NOW) == expected
    assert retry_after_of({}, NOW) is None
