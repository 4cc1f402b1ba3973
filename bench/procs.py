"""Starting and stopping the bench's processes: every one by its PID, every wait bounded, loopback only."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
HOST = "127.0.0.1"


# mitmproxy's line once a proxy mode has bound its socket (proxy/mode_servers.py): with `-p 0`
# the kernel picks the port at bind time, and this line says which.
LISTENING = re.compile(r"proxy[^\n]* listening at 127\.0\.0\.1:(\d+)\.")


def free_port() -> int:
    """
    A loopback port nothing listens on, that no other process will be handed for a minute: only
    for the bench upstream, whose port bench/__main__.py takes before it starts (mitmdump
    binds port 0 instead). Not closed plainly, which would let any other process's bind to
    port 0 take it before the upstream binds it: a connection is accepted and the accepted side
    closed first, leaving the port in TIME_WAIT (60 s on Linux). Linux does not hand a port in
    TIME_WAIT to a bind to port 0, while the upstream (asyncio: SO_REUSEADDR) binds it by number.
    The same as tests/upstream.py's free_port.
    """
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((HOST, 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        with socket.create_connection((HOST, port), timeout=5):
            accepted, _ = listener.accept()
            accepted.close()  # the side that closes first keeps the TIME_WAIT: this port's side
    return port


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((HOST, port)) == 0


class Process:
    """
    A child process whose output goes to a log file; `ready` is a line it must print. `port`:
    the port it listens on, if known before it starts; with `listening`, the port is read
    from mitmproxy's "listening at" line instead (a mitmdump started with `-p 0`).
    """

    def __init__(
        self,
        name: str,
        args: list[str],
        log: Path,
        ready: str,
        port: int | None = None,
        cwd: Path = ROOT,
        listening: bool = False,
        cpus: set[int] | None = None,
    ):
        self.name, self.args, self.log_path, self.ready, self.port, self.cwd = name, args, log, ready, port, cwd
        self.listening = listening
        self.cpus = cpus  # the CPUs it runs on (`scripts/bench --pin`), set before it starts; None: the bench's
        self.proc: subprocess.Popen | None = None

    def start(self) -> Process:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - open while the process runs; stop() closes it
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "NO_PROXY": "*", "no_proxy": "*"}
        for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
            env.pop(k, None)
        cpus = self.cpus
        self.proc = subprocess.Popen(
            self.args,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.cwd,
            env=env,
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
        )
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    @property
    def pid(self) -> int:
        """The PID of the process start() began (and stop() has not yet ended)."""
        assert self.proc is not None, f"{self.name} is not running"
        return self.proc.pid

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            text = self.log()
            if self.listening and (m := LISTENING.search(text)):
                self.port = int(m.group(1))
            if self.ready in text and (not self.listening or self.port) and (self.port is None or port_open(self.port)):
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
    p = Process(
        "upstream",
        [sys.executable, "-m", "bench.upstream", str(port)],
        workdir / "upstream.log",
        "bench-upstream: listening",
        port,
    )
    return p, port


PROXY_CPUS: set[int] | None = None  # `--pin`: where every mitmdump runs (the bench and the rest: the other CPUs)


def pin(pinned: bool) -> str:
    """`--pin`: the proxies on the last CPU, this process (so the client, and every other child) on the
    others; one process's CPU time then varies least from run to run. What it did, to say in the log."""
    global PROXY_CPUS
    cpus = sorted(os.sched_getaffinity(0))
    if not pinned or len(cpus) < 2:
        PROXY_CPUS = None
        return "not pinned" + (" (--pin needs 2 CPUs)" if pinned else "")
    PROXY_CPUS = {cpus[-1]}
    os.sched_setaffinity(0, set(cpus[:-1]))
    return f"pinned: every mitmdump on CPU {cpus[-1]}, the client, the upstream and the rest on {cpus[:-1]}"


def mitmdump(name: str, workdir: Path, script: Path, ready: str, extra: Sequence[str] = ()) -> Process:
    """mitmdump on 127.0.0.1 with defaults, one script, and its own confdir (its own CA); its
    port (`.port`) is the kernel's pick, known once wait_ready() returns."""
    confdir = workdir / f"conf-{name}"
    confdir.mkdir(exist_ok=True)
    args = [
        str(BIN / "mitmdump"),
        "--listen-host",
        HOST,
        "-p",
        "0",
        "--set",
        f"confdir={confdir}",
        "-s",
        str(script),
        *extra,
    ]
    return Process(name, args, workdir / f"{name}.log", ready, listening=True, cpus=PROXY_CPUS)
