"""
`receipts list` in a process of its own holds a page of receipts, not every one: its peak memory on a
database of MANY receipts (the rest of `list`: tests/cli/test_receipt_commands_list.py).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.cli.conftest import ROOT
from tests.cli.test_receipt_commands_list import MANY

PEAK = (
    "import resource, sys\n"
    "from proxy_addon.cli import main\n"
    "code = main(sys.argv[1:])\n"
    "sys.stdout.flush()\n"
    "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"  # KiB on Linux
    "sys.exit(code)\n"
)


def peak_kib(db, *argv: str) -> tuple[int, int]:
    """`receipts --db DB list ARGV` in its own process, its output thrown away: (lines printed, peak RSS in KiB)."""
    p = subprocess.run(
        [sys.executable, "-c", PEAK, "--db", str(db), "list", *argv],
        capture_output=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "HOME": str(db.parent)},
    )
    assert p.returncode == 0, p.stderr.decode()
    return p.stdout.count(b"\n"), int(p.stderr.decode().split()[-1])


@pytest.mark.parametrize("json_out", [False, True], ids=["table", "json"])
def test_list_holds_a_page_of_receipts_not_every_one(many, json_out):
    fmt = ("--json",) if json_out else ()
    few_lines, few = peak_kib(many, "--limit", "10", *fmt)
    all_lines, everything = peak_kib(many, "--limit", "1000000", *fmt)
    assert all_lines > MANY > few_lines  # every receipt printed
    # Held at once, MANY receipts take well over 100 MB here; a page of them, a few MB.
    assert everything - few < 40 * 1024, f"listing {MANY} receipts took {(everything - few) // 1024} MB more"
