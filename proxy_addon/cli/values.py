"""Values the user types: ages, times, positive numbers, header names and values, and who resolves."""

from __future__ import annotations

import argparse
import datetime as dt
import getpass
import math
import re

from proxy_addon.store import iso

SINCE_HELP = (
    "only since T: an ISO date or time (2026-11-01, 2026-11-01T12:00:00Z; UTC unless it says otherwise) "
    "or an age (90m, 2h, 7d)"
)
AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class UsageError(Exception):
    """A bad value the user can fix; printed as one `Error: ...` line, exit status 1."""


def parse_age(text: str, option: str) -> dt.timedelta:
    """`90m`, `12h`, `30d`, `2w` (also `45s`) as a timedelta."""
    m = re.fullmatch(r"\s*(\d+)\s*([smhdw])\s*", text)
    if not m:
        raise UsageError(
            f"{option}: {text!r} is not an age; use a number and a unit s, m, h, d or w, like 90m, 12h, 30d"
        )
    try:
        return dt.timedelta(seconds=int(m[1]) * AGE_UNITS[m[2]])
    except OverflowError:
        raise UsageError(f"{option}: {text!r} is too long ago") from None


def parse_since(text: str | None, now: dt.datetime, option: str = "--since") -> str | None:
    """An ISO date/time or an age, as the store's time format (`2026-11-29T18:57:11.913481Z`)."""
    if text is None:
        return None
    if re.fullmatch(r"\s*\d+\s*[smhdw]\s*", text):
        try:
            return iso(now - parse_age(text, option))
        except OverflowError:
            raise UsageError(f"{option}: {text!r} is too long ago") from None
    try:
        t = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(
            f"{option}: {text!r} is neither an ISO date or time (2026-11-01, 2026-11-01T12:00:00Z) "
            "nor an age (90m, 2h, 7d)"
        ) from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    try:
        return iso(t)
    except OverflowError:
        raise UsageError(f"{option}: {text!r} is out of range") from None


def age(since: str, now: dt.datetime) -> str:
    """How long ago an ISO time was, compactly: `45s`, `3m`, `2h`, `5d`."""
    seconds = int((now - dt.datetime.fromisoformat(since)).total_seconds())
    seconds = max(seconds, 0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def positive_seconds(text: str) -> float:
    try:
        n = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(n) or n <= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, not {text}")
    return n


HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP token


def sendable(value: str) -> bool:
    """Whether an HTTP/1.1 header can carry the value: printable ASCII, no CR, LF or other control."""
    return value.isascii() and value.isprintable()


def seconds_or_age(text: str) -> float:
    """`86400`, `90m`, `24h`, `7d` as seconds (an argparse type)."""
    m = re.fullmatch(r"\s*([0-9]+)\s*([smhdw]?)\s*", text)
    if not m or int(m[1]) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0 or an age like 90m, 24h")
    return float(int(m[1]) * (AGE_UNITS[m[2]] if m[2] else 1))


def positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {n}")
    return n


def cli_actor() -> str:
    """Who resolves: `cli:<login name>`, or `cli` when there is no login name."""
    try:
        user = getpass.getuser()
    except Exception:  # OSError without a login name or passwd entry; KeyError on older Pythons
        return "cli"
    return f"cli:{user}" if user else "cli"
