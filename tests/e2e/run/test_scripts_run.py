"""
scripts/run as a user meets it: the `Web UI:` line's URL opens mitmweb (its token is
scripts/run's, mitmweb gets only a hash of it), a web_password of the user's own is left
alone, and a port already taken is named by the variable that sets it, before mitmproxy starts.

Real scripts/run processes on free ports, each with its own state dir, stopped by PID
(scripts/run execs mitmproxy, so its PID is mitmproxy's); mitmweb is asked with a real HTTP
client (requests, ignoring any proxy variables of the environment).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import pytest
import requests

from tests.conftest import ROOT, TEST_RULES, deadline, wait_for
from tests.e2e.processes import ScriptsRun
from tests.upstream import free_port

RUN = ROOT / "scripts" / "run"


def get(url: str, **kwargs) -> requests.Response:
    with requests.Session() as s:
        s.trust_env = False  # straight to mitmweb, whatever http_proxy says
        return s.get(url, timeout=10, **kwargs)


def test_the_web_ui_line_opens_mitmweb(tmp_path, confdir):
    run = ScriptsRun(tmp_path, confdir).start()
    try:
        assert run.proc is not None
        url = run.web_url  # the banner's "Web UI:" line (tests/conftest.py WEB_URL)
        base, _, query = url.partition("?")
        token = query.removeprefix("token=")
        assert re.fullmatch(r"[0-9a-f]{32}", token), url

        page = get(url)
        assert page.status_code == 200, page.text[:500]
        assert "mitmproxy" in page.text.lower()
        assert get(base).status_code == 403
        assert get(f"{base}?token={'0' * 32}").status_code == 403
        # What a script uses: the same token as a bearer token, on mitmweb's API.
        flows = get(f"{base}flows", headers={"Authorization": f"Bearer {token}"})
        assert flows.status_code == 200 and flows.json() == [], flows.text[:500]

        # The token is in no process's command line (ps shows it to every local user): mitmweb's
        # web_password is an argon2 hash of it, and mitmweb says nothing about a plaintext password.
        cmdline = Path(f"/proc/{run.proc.pid}/cmdline").read_bytes()
        assert token.encode() not in cmdline
        assert b"web_password=$argon2id$" in cmdline
        assert "plaintext password" not in run.log()
    finally:
        run.stop()


def test_a_web_password_of_your_own_is_left_alone(tmp_path, confdir):
    web_port = free_port()
    env = {
        **os.environ,
        "RECEIPT_PROXY_STATE_DIR": str(tmp_path / "state"),
        "RECEIPT_PROXY_RULES": str(TEST_RULES),
        "RECEIPT_PROXY_PORT": "0",
        "RECEIPT_PROXY_WEB_PORT": str(web_port),
        "PYTHONUNBUFFERED": "1",
    }
    log = tmp_path / "run.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(RUN), "--", "--set", f"confdir={confdir}", "--set", "web_password=open-sesame"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
        )
    try:
        wait_for(
            lambda: proc.poll() is not None or "receipt-proxy: ready" in log.read_text(errors="replace"),
            timeout=60,
            what=f"scripts/run to be ready (log: {log})",
        )
        text = log.read_text(errors="replace")
        assert proc.poll() is None, text
        assert f"Web UI: http://127.0.0.1:{web_port}/ (log in with your web_password)" in text, text
        assert get(f"http://127.0.0.1:{web_port}/?token=open-sesame").status_code == 200
        assert get(f"http://127.0.0.1:{web_port}/").status_code == 403
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=deadline(20))


@pytest.mark.parametrize("variable", ["RECEIPT_PROXY_PORT", "RECEIPT_PROXY_WEB_PORT"])
def test_a_busy_port_is_named_by_its_variable(tmp_path, confdir, variable):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        ports = {"RECEIPT_PROXY_PORT": "0", "RECEIPT_PROXY_WEB_PORT": str(free_port()), variable: str(port)}
        env = {
            **os.environ,
            **ports,
            "RECEIPT_PROXY_STATE_DIR": str(tmp_path / "state"),
            "RECEIPT_PROXY_RULES": str(TEST_RULES),
        }
        headless = ["--headless"] if variable == "RECEIPT_PROXY_PORT" else []
        p = subprocess.run(
            [str(RUN), *headless, "--", "--set", f"confdir={confdir}"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=deadline(60),
        )
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert f"error: {variable}={port}: 127.0.0.1:{port} is taken" in p.stderr, out
    assert f"{variable}=<port> scripts/run" in p.stderr, out
    assert "--mode regular@" not in out, out
    assert "Loading script" not in out, out  # mitmproxy never started


def test_help_prints_the_header_comment_only():
    p = subprocess.run([str(RUN), "--help"], capture_output=True, text=True, timeout=deadline(30))
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("Start receipt-proxy:"), p.stdout
    assert (
        '"Web UI:" line' in p.stdout
        and "RECEIPT_PROXY_WEB_PORT (8081)" in p.stdout
        and "RECEIPT_PROXY_METRICS" in p.stdout
    ), p.stdout
    assert "set -euo" not in p.stdout and "source" not in p.stdout, p.stdout  # no line of the script's code
