"""
The real proxy `receipts demo` runs: the mitmdump beside this Python (the venv's), with the addon, as
`scripts/run --headless` starts it, but on 127.0.0.1 and a port the kernel picks (`-p 0`), with every
file it writes (receipts.db, secret.key, mitmproxy's CA) in the demo's temporary directory.

Ready is what the process itself says: mitmproxy's "listening at 127.0.0.1:PORT" line (the only place
that names the port) and the addon's "receipt-proxy: ready (recording)", polled from its log with a
deadline long enough for a loaded machine. `stop()` ends it by its PID: SIGTERM (it drains and exits),
then SIGKILL if it has not exited within 10 s.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from proxy_addon.errors import ReceiptsError

ADDON = Path(__file__).resolve().parent.parent / "addon.py"
# mitmproxy's line once it has bound its socket (proxy/mode_servers.py: "... listening at ADDRESS.").
LISTENING = re.compile(r"HTTP\(S\) proxy[^\n]* listening at 127\.0\.0\.1:(\d+)\.")
READY = re.compile(r"receipt-proxy: ready \(([^)\n]*)\)")
READY_WAIT = 180.0  # seconds: mitmdump starts in 2 s on a quiet machine; under load it takes many times that


class DemoProxyError(ReceiptsError):
    """The proxy did not start; the message has the end of its log."""


def mitmdump() -> str:
    """The venv's mitmdump (beside this Python), else one on the PATH."""
    beside = Path(sys.executable).parent / "mitmdump"
    found = str(beside) if beside.exists() else shutil.which("mitmdump")
    if found is None:
        raise DemoProxyError(
            f"no mitmdump beside {sys.executable} nor on the PATH: run the demo with the venv that "
            "scripts/run creates (.venv/bin/receipts demo)"
        )
    return found


class DemoProxy:
    """A mitmdump process with the addon; its state in `workdir`; `with DemoProxy(...) as proxy:`."""

    def __init__(self, workdir: Path, rules: Path) -> None:
        self.workdir = workdir
        self.rules = rules
        self.db = workdir / "receipts.db"
        self.log_path = workdir / "proxy.log"
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def args(self) -> list[str]:
        return [
            mitmdump(),
            "--listen-host",
            "127.0.0.1",
            "-p",
            "0",
            "-s",
            str(ADDON),
            "--set",
            f"confdir={self.workdir / 'mitmproxy'}",
            "--set",
            f"receipts_db={self.db}",
            "--set",
            f"receipts_rules={self.rules}",
            "--set",
            "flow_detail=0",
        ]

    def start(self) -> DemoProxy:
        with open(self.log_path, "wb") as log:  # the child keeps its own descriptor
            self._proc = subprocess.Popen(
                self.args(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_WAIT
        while time.monotonic() < deadline:
            assert self._proc is not None
            text = self.log()
            if self._proc.poll() is not None:
                raise DemoProxyError(f"mitmdump exited with status {self._proc.returncode}:\n{_tail(text)}")
            listening, ready = LISTENING.search(text), READY.search(text)
            if listening and ready:
                if ready.group(1) != "recording":
                    raise DemoProxyError(f"the addon did not load: {ready.group(1)}\n{_tail(text)}")
                self.port = int(listening.group(1))
                return
            time.sleep(0.1)
        raise DemoProxyError(f"mitmdump was not ready after {READY_WAIT:.0f} s:\n{_tail(self.log())}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()

    def __enter__(self) -> DemoProxy:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join("  " + line for line in text.splitlines()[-lines:])
