"""
The MCP test server (tests/e2e/mcp/server.py) as a subprocess, for the MCP tests; stopped by its PID.

    with McpServer("json") as server:          # or "sse"
        server.url                             # http://127.0.0.1:PORT/mcp
        server.reset(); server.queue("commit_then_drop")
        server.effects()["created"]            # issues recorded by the server

    McpServer("json", workdir, tls=True)     # https; server.cert_path is the CA a proxy trusts upstream
    McpServer("sse", workdir, speaks="2026-07-28", extra_tools=True)
                                             # one revision only; find_issues and create_confirmed_issue served
    server.can({"result": {...}})              # the next tools/call gets this hand-made answer

`BareMitmdump(workdir, confdir, upstream_ca=None)`: a mitmdump without the addon (the baseline).
Fixtures: `mcp_json_server`, `mcp_sse_server` (one per module), `mcp_server` parametrized over both
modes (a module using it gets both; reset for each test), `bare_mitmdump` (one per module). A test
module under tests/e2e/mcp/ gets them from its conftest.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

READY = re.compile(r"mcp_server: ready (https?://127\.0\.0\.1:(\d+)/mcp)")
MODES = ("json", "sse")


class McpServer:
    """`python -m tests.e2e.mcp.server --port 0 --json|--sse` in `workdir`; its URL read from its ready line."""

    def __init__(
        self,
        mode: str,
        workdir: Path,
        *,
        hang: float = 3.0,
        tls: bool = False,
        speaks: str | None = None,
        extra_tools: bool = False,
    ):
        assert mode in MODES, mode
        self.mode, self.hang, self.tls = mode, hang, tls
        self.speaks = speaks  # the one revision it speaks (--speaks), or None: each
        self.options = [*(["--speaks", speaks] if speaks else []), *(["--extra-tools"] if extra_tools else [])]
        self.cert_path = workdir / "upstream-cert.pem" if tls else None  # the CA a proxy trusts upstream
        self.log_path = workdir / f"mcp-server-{mode}-{uuid.uuid4().hex[:6]}.log"
        self.proc: subprocess.Popen | None = None
        self.url = self.base = ""

    def start(self) -> McpServer:
        from tests.e2e.processes import until_ready

        tls = ["--tls", str(self.log_path.parent)] if self.tls else []
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.e2e.mcp.server",
                    "--port",
                    "0",
                    f"--{self.mode}",
                    "--hang",
                    str(self.hang),
                    *tls,
                    *self.options,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        match = until_ready(self.proc, self.log_path, self._ready, "the MCP server to listen")
        self.url = match.group(1)
        self.base = self.url.removesuffix("/mcp")
        return self

    def _ready(self):
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"the MCP server exited with {self.proc.returncode}:\n{self.log()}")
        return READY.search(self.log_path.read_text(errors="replace"))

    def stop(self) -> None:
        from tests.e2e.processes import stop_process

        stop_process(self.proc)

    def __enter__(self) -> McpServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _control(self, method: str, path: str, body: dict | None = None) -> Any:
        import ssl

        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.base + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        handlers: list = [urllib.request.ProxyHandler({})]  # direct, never through a proxy
        if self.cert_path:
            handlers.append(urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=self.cert_path)))
        opener = urllib.request.build_opener(*handlers)
        with opener.open(req, timeout=10) as r:
            return json.loads(r.read())

    def effects(self) -> dict[str, Any]:
        """{"created": n, "issues": [...], "requests": [...], "queued": [...]} (tests/e2e/mcp/server.py)."""
        return self._control("GET", "/_effects")

    def calls(self, tool: str | None = None) -> list[dict[str, Any]]:
        """The tools/call requests the server saw (of `tool`, if given), in order."""
        return [
            r
            for r in self.effects()["requests"]
            if r["jsonrpc_method"] == "tools/call" and (tool is None or r["tool"] == tool)
        ]

    def reset(self) -> None:
        self._control("POST", "/_reset")

    def can(self, message: dict, **how) -> None:
        """The next tools/call is answered with this JSON-RPC `message` (how: id=, framing="sse", status=)."""
        self._control("POST", "/_canned", {"message": message, **how})

    def queue(self, *faults: str) -> None:
        """The next create_issue calls get these faults, one each, in order."""
        self._control("POST", "/_faults", {"faults": list(faults)})


class BareMitmdump:
    """A mitmdump without the receipts addon (the baseline), on a port the kernel picks; stopped by PID."""

    def __init__(self, workdir: Path, confdir: Path, upstream_ca: Path | None = None):
        self.workdir, self.confdir, self.upstream_ca = workdir, confdir, upstream_ca
        self.log_path = workdir / f"bare-mitmdump-{uuid.uuid4().hex[:6]}.log"
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def start(self) -> BareMitmdump:
        from tests.e2e.processes import BIN, LISTENING, until_ready

        args = [
            str(BIN / "mitmdump"),
            "--listen-host",
            "127.0.0.1",
            "-p",
            "0",
            "--set",
            f"confdir={self.confdir}",
            "--set",
            "flow_detail=0",
        ]
        if self.upstream_ca:
            args += ["--set", f"ssl_verify_upstream_trusted_ca={self.upstream_ca}"]
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=self.workdir)

        def listening():
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"mitmdump exited with {self.proc.returncode}:\n{self.log_path.read_text()}")
            return LISTENING.search(self.log_path.read_text(errors="replace"))

        self.port = int(until_ready(self.proc, self.log_path, listening, "the bare mitmdump to listen").group(1))
        return self

    def stop(self) -> None:
        from tests.e2e.processes import stop_process

        stop_process(self.proc)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ca(self) -> Path:
        return self.confdir / "mitmproxy-ca-cert.pem"


@pytest.fixture(scope="module")
def bare_mitmdump(tmp_path_factory, confdir):
    proxy = BareMitmdump(tmp_path_factory.mktemp("bare-mitmdump"), confdir).start()
    yield proxy
    proxy.stop()


@pytest.fixture(scope="module")
def mcp_json_server(tmp_path_factory):
    with McpServer("json", tmp_path_factory.mktemp("mcp-json")) as server:
        yield server


@pytest.fixture(scope="module")
def mcp_sse_server(tmp_path_factory):
    with McpServer("sse", tmp_path_factory.mktemp("mcp-sse")) as server:
        yield server


@pytest.fixture(params=MODES)
def mcp_server(request) -> McpServer:
    """The module's MCP server in each response mode, reset for this test."""
    server = request.getfixturevalue(f"mcp_{request.param}_server")
    server.reset()
    return server
