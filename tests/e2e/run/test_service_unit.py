"""
docs/receipt-proxy.service, the example systemd unit (docs/running.md, "Run it as a service").

- `systemd-analyze verify` finds nothing to say about it (it warns, with exit status 0, about
  an unknown key or a value it cannot parse, so the test asserts silence, not only the status).
  The only change: the checkout's path /opt/receipt-proxy becomes this checkout, since verify
  checks that ExecStart= is an executable file. Skipped where systemd-analyze is not installed.
- What it promises holds: a user of its own, PYTHON= for a Python off that user's PATH, the
  state directory systemd creates passed as RECEIPT_PROXY_STATE_DIR, restarts on failure,
  SIGTERM with a stop timeout longer than receipts_drain_timeout, `scripts/run --headless`.
- Its command runs as the unit runs it: ExecStart= with the unit's Environment= (%S a temporary
  directory; RECEIPT_PROXY_PORT 0 rather than 8080, RECEIPT_PROXY_VENV the venv running the
  tests), until "receipt-proxy: ready"; then SIGTERM, as systemd stops it, and exit status 0
  well within TimeoutStopSec; the receipts DB, the key and mitmproxy's CA in the state dir.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from proxy_addon.mitm.options import OPTIONS
from tests.conftest import ROOT, wait_for
from tests.e2e.processes import LISTENING

UNIT = ROOT / "docs" / "receipt-proxy.service"
CHECKOUT = "/opt/receipt-proxy"  # where the unit expects the checkout


def unit_text() -> str:
    return UNIT.read_text().replace(CHECKOUT, str(ROOT))


def service() -> dict[str, list[str]]:
    """The [Service] section: each key's values, in order (Environment= repeats). The unit uses no continuations."""
    values: dict[str, list[str]] = {}
    section = ""
    for raw in unit_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "Service":
            key, _, value = line.partition("=")
            values.setdefault(key, []).append(value)
    return values


def environment(svc: dict[str, list[str]]) -> dict[str, str]:
    return dict(line.split("=", 1) for line in svc["Environment"])


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_systemd_analyze_verify_is_silent(tmp_path):
    unit = tmp_path / UNIT.name
    unit.write_text(unit_text())
    p = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert (p.returncode, p.stdout + p.stderr) == (0, ""), p.stdout + p.stderr


def test_the_unit_says_what_the_readme_says():
    svc = service()
    env = environment(svc)
    drain = next(o.default for o in OPTIONS if o.name == "receipts_drain_timeout")
    assert svc["User"][0] not in ("", "root") and svc["Group"] == svc["User"]
    assert Path(env["PYTHON"]).is_absolute()
    assert env["RECEIPT_PROXY_STATE_DIR"] == f"%S/{svc['StateDirectory'][0]}"
    assert svc["StateDirectoryMode"] == ["0700"]
    assert svc["Restart"] == ["on-failure"]
    assert svc["KillSignal"] == ["SIGTERM"]
    assert int(svc["TimeoutStopSec"][0]) > drain + 5, (svc["TimeoutStopSec"], drain)
    assert shlex.split(svc["ExecStart"][0])[:2] == [str(ROOT / "scripts" / "run"), "--headless"]


def test_its_command_runs_and_stops_on_sigterm(tmp_path):
    svc = service()
    state_root = tmp_path / "var-lib"
    state = state_root / svc["StateDirectory"][0]
    state.mkdir(parents=True, mode=0o700)  # what StateDirectory= does before the start
    env = {name: value.replace("%S", str(state_root)) for name, value in environment(svc).items()}
    env |= {
        "RECEIPT_PROXY_PORT": "0",
        "RECEIPT_PROXY_VENV": sys.prefix,
        "HOME": str(state),
        "PATH": os.environ["PATH"],
        "PYTHONUNBUFFERED": "1",
    }
    command = shlex.split(svc["ExecStart"][0].replace("%S", str(state_root)))
    log = tmp_path / "journal.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, env=env, cwd=svc["WorkingDirectory"][0], stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(
            lambda: proc.poll() is not None or "receipt-proxy: ready" in log.read_text(errors="replace"),
            timeout=60,
            what=f"the unit's command to be ready (log: {log})",
        )
        text = log.read_text(errors="replace")
        assert proc.poll() is None and LISTENING.search(text), text
        assert "receipt-proxy: ready (recording)" in text, text
        os.kill(proc.pid, signal.SIGTERM)  # KillSignal=SIGTERM: scripts/run exec'd mitmdump, the main PID
        assert proc.wait(timeout=int(svc["TimeoutStopSec"][0])) == 0, log.read_text(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert {"receipts.db", "secret.key"} <= {p.name for p in state.iterdir()}
    assert (state / "mitmproxy" / "mitmproxy-ca-cert.pem").is_file()
