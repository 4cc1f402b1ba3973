"""`receipts`: the ages and times --since and --older-than take, and the ages `list` shows."""

from __future__ import annotations

import datetime as dt
import json
import time

import pytest

from proxy_addon import cli as cli_module
from tests.cli.conftest import NOW, assert_one_line_error, cli, dump
from tests.conftest import T0


@pytest.mark.parametrize(
    "seconds, expected",
    [
        (0, "0s"),
        (59, "59s"),
        (60, "1m"),
        (3 * 60 + 59, "3m"),
        (3599, "59m"),
        (3600, "1h"),
        (2 * 3600, "2h"),
        (86399, "23h"),
        (86400, "1d"),
        (5 * 86400 + 7200, "5d"),
        (400 * 86400, "400d"),
        (-30, "0s"),
    ],
)
def test_age(seconds, expected):
    assert cli_module.age("2026-03-01T12:00:00.000000Z", T0 + dt.timedelta(seconds=seconds)) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2h", "2026-03-06T10:00:00.000000Z"),
        ("90m", "2026-03-06T10:30:00.000000Z"),
        ("7d", "2026-02-27T12:00:00.000000Z"),
        ("1w", "2026-02-27T12:00:00.000000Z"),
        ("45s", "2026-03-06T11:59:15.000000Z"),
        ("2026-11-01", "2026-11-01T00:00:00.000000Z"),
        ("2026-11-01T12:00:00Z", "2026-11-01T12:00:00.000000Z"),
        ("2026-11-01T12:00:00.5Z", "2026-11-01T12:00:00.500000Z"),
        ("2026-11-01T12:00:00-05:00", "2026-11-01T17:00:00.000000Z"),
        ("2026-11-01 12:00", "2026-11-01T12:00:00.000000Z"),
    ],
)
def test_parse_since(text, expected):
    assert cli_module.parse_since(text, NOW) == expected


@pytest.fixture
def new_york(monkeypatch):
    """The machine's local time zone is five hours behind UTC in March."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_since_without_a_zone_is_utc_not_local_time(timeline, capsys, new_york):
    assert dt.datetime(2026, 3, 1, 12).astimezone().utcoffset() == dt.timedelta(hours=-5)  # the fixture works
    assert cli_module.parse_since("2026-03-01T13:00:00", NOW) == "2026-03-01T13:00:00.000000Z"
    path, ids = timeline
    _, out, _ = cli(capsys, "--db", str(path), "list", "--since", "2026-03-01", "--json")
    assert [r["operation_id"] for r in json.loads(out)] == [
        ids["medium.com/articles.create"],
        ids["dev.to/articles.update"],
        ids["dev.to/articles.create"],
    ]


BAD_SINCE = ["yesterday", "2h ago", "-2h", "2", "h", "2026-13-01", "2026-11-01T25:00", "1.5d", "", "99999999999d"]


@pytest.mark.parametrize(
    "command, since",
    [("list", s) for s in BAD_SINCE] + [(c, s) for c in ("blocked", "export") for s in ("yesterday", "-2h", "2")],
)
def test_bad_since_is_a_one_line_error(db, capsys, command, since):
    path, _ = db
    before = dump(path)
    code, out, err = cli(capsys, "--db", str(path), command, f"--since={since}")  # =: "-2h" is not an option
    assert_one_line_error(code, out, err, "--since", repr(since))
    assert dump(path) == before
