"""
The installed `receipts` script (.venv/bin/receipts) in a process of its own: the help of every
command (in-process: tests/cli/test_main.py).
"""

from __future__ import annotations

import os
import signal
import subprocess

from proxy_addon.cli import COMMANDS
from tests.cli.conftest import RECEIPTS
from tests.conftest import deadline
from tests.e2e.processes import stop_process


def test_installed_script_help_of_every_command(tmp_path):
    assert RECEIPTS.exists(), f"{RECEIPTS} is not installed; run scripts/test to create the venv"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECEIPT_PROXY_")}
    env["HOME"] = str(tmp_path)
    runs = {
        name: subprocess.Popen(
            [str(RECEIPTS), *([name] if name else []), "--help"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for name in ["", *COMMANDS]
    }
    missing = subprocess.Popen(
        [str(RECEIPTS), "--db", str(tmp_path / "none.db"), "list"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        check_help(runs, missing, tmp_path)
    finally:
        for proc in [*runs.values(), missing]:
            stop_process(proc, signal.SIGKILL)


def check_help(runs: dict[str, subprocess.Popen], missing: subprocess.Popen, tmp_path) -> None:
    # All of them start at once: on a loaded machine, each may wait long for its CPU share.
    for name, proc in runs.items():
        out, err = proc.communicate(timeout=deadline(30))
        assert (proc.returncode, err) == (0, ""), name
        assert out.startswith(f"usage: receipts {name}".rstrip()), name
        assert "\nexamples:\n" in out, name
        if name:
            for example in COMMANDS[name].examples:
                assert f"\n  {example}\n" in out
                assert example.startswith(f"receipts {name}")
        else:
            for command in COMMANDS:
                assert f"\n  receipts {command} " in out
    out, err = missing.communicate(timeout=deadline(30))
    assert (missing.returncode, out) == (1, "")
    assert err == f"Error: no receipts database at {tmp_path / 'none.db'}\n"
    assert not (tmp_path / "none.db").exists()
