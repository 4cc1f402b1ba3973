"""Starting and stopping the bench's processes: every one by its PID, every wait bounded, loopback only."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((HOST, port)) == 0


class Process:
    """A child process whose output goes to a log file; `ready` is a line it must print."""

    def __init__(self, name: str, args: list[str], log: Path, ready: str, port: int | None = None,
                 cwd: Path = ROOT):
        self.name, self.args, self.log_path, self.ready, self.port, self.cwd = name, args, log, ready, port, cwd
        self.proc: subprocess.Popen | None = None

    def start(self) -> Process:
        self._log = open(self.log_path, "ab")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "NO_PROXY": "*", "no_proxy": "*"}
        for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
            env.pop(k, None)
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     cwd=self.cwd, env=env)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            if self.ready in self.log() and (self.port is None or port_open(self.port)):
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} not ready after {timeout:g}s (log: {self.log_path}):\n{self.log()[-3000:]}")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._log.close()
        self.proc = None


def upstream(workdir: Path) -> tuple[Process, int]:
    port = free_port()
    p = Process("upstream", [sys.executable, "-m", "bench.upstream", str(port)], workdir / "upstream.log",
                "bench-upstream: listening", port)
    return p, port


def mitmdump(name: str, workdir: Path, script: Path, ready: str, extra: list[str] = ()) -> Process:
    """mitmdump on 127.0.0.1 with defaults, one script, and its own confdir (its own CA)."""
    port = free_port()
    confdir = workdir / f"conf-{name}"
    confdir.mkdir(exist_ok=True)
    args = [str(BIN / "mitmdump"), "--listen-host", HOST, "-p", str(port), "--set", f"confdir={confdir}",
            "-s", str(script), *extra]
    return Process(name, args, workdir / f"{name}.log", ready, port)
