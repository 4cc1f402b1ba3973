"""
`receipts demo` (proxy_addon/cli/demo_command.py). It starts real processes: a mitmdump, the
`receipts reconcile` it runs, and here the installed `receipts` script itself.

What it prints, step by step, with the API's write count after each step (1); and that it leaves
nothing running: the proxy's PID is gone, the proxy's and the API's ports are closed, no thread or
child process it started is alive, and its temporary directory is removed. It writes nothing
in $HOME (no ~/.mitmproxy, no ~/.local/state). A step that goes otherwise (an API that answers
the first write) stops it with exit status 1, and cleans up all the same.
"""

from __future__ import annotations

import functools
import os
import re
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from proxy_addon.cli import demo_command
from proxy_addon.cli.demo_api import DemoApi
from tests.cli.conftest import RECEIPTS, cli

RUN_WAIT = 600  # seconds: the demo takes a few; a loaded machine may take many times that

STEPS = [
    "1. The agent creates a thing",
    "agent gets: 502 outcome_unknown",
    ": outcome_unknown   the API's writes: 1",
    "2. The agent retries the same write",
    "agent gets: 409 duplicate_unresolved (Retry-After: 1)",
    ": outcome_unknown   the API's writes: 1",
    "3. A read settles it",
    "  outcome_unknown → succeeded  read GET http://127.0.0.1:",
    "the read found the thing the first write made; the API's writes: 1",
    "4. The agent retries once more",
    "agent gets: 409 duplicate_succeeded, external_id 1:",
    ": succeeded   the API's writes: 1",
    "The API committed 1 write; the agent sent it 3 times.",
]


def in_order(out: str, parts: list[str]) -> list[str]:
    """The parts not found in `out` after the previous one: [] when all are there, in this order."""
    missing, at = [], 0
    for part in parts:
        found = out.find(part, at)
        if found < 0:
            missing.append(part)
        else:
            at = found + len(part)
    return missing


def what_it_started(out: str) -> tuple[Path, int, int, int]:
    """Its directory, the API's port, the proxy's port and the proxy's PID, as the demo printed them."""
    workdir = re.search(r"its files: (\S+) \(removed at the end\)", out)
    api = re.search(r"the API: +http://127\.0\.0\.1:(\d+) ", out)
    proxy = re.search(r"the proxy: http://127\.0\.0\.1:(\d+) \(mitmdump, pid (\d+)\)", out)
    assert workdir and api and proxy, out
    return Path(workdir.group(1)), int(api.group(1)), int(proxy.group(1)), int(proxy.group(2))


def assert_nothing_left(out: str) -> None:
    workdir, api_port, proxy_port, pid = what_it_started(out)
    assert not workdir.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    for port in (api_port, proxy_port):
        with socket.socket() as s, pytest.raises(ConnectionRefusedError):
            s.connect(("127.0.0.1", port))


def children() -> set[int]:
    """The PIDs of this process's children, from /proc."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid():
            found.add(int(stat.parent.name))
    return found


def test_the_story_and_nothing_left_running(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECEIPT_PROXY_")}
    env["HOME"] = str(tmp_path)
    done = subprocess.run(
        [str(RECEIPTS), "demo"], capture_output=True, text=True, env=env, timeout=RUN_WAIT, stdin=subprocess.DEVNULL
    )
    assert (done.returncode, done.stderr) == (0, ""), done.stdout
    assert in_order(done.stdout, STEPS) == [], done.stdout
    counts = re.findall(r"the API's writes: (\d+)", done.stdout)
    assert counts == ["1"] * 4, done.stdout
    assert "127.0.0.1" in done.stdout and "0.0.0.0" not in done.stdout
    assert_nothing_left(done.stdout)
    assert list(tmp_path.iterdir()) == []  # nothing in $HOME: no ~/.mitmproxy, no receipts.db


def test_a_step_off_script_stops_it_and_it_still_cleans_up(capsys, monkeypatch):
    """An API that answers the first write (no drop): step 1 gets 201, not 502; exit 1, nothing left."""
    monkeypatch.setattr(demo_command, "DemoApi", functools.partial(DemoApi, drop_writes=0))
    threads, kids = set(threading.enumerate()), children()
    code, out, err = cli(capsys, "demo")
    assert code == 1
    assert err.startswith("Error: expected 502 outcome_unknown, the agent got 201: "), err
    assert "1. The agent creates a thing" in out and "2. The agent retries" not in out
    assert_nothing_left(out)
    assert [t for t in threading.enumerate() if t not in threads] == []
    assert children() - kids == set()
