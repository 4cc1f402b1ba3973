"""
mitm/flow_file.py: a flow file written by mitmproxy's own writer read back into request shapes, as
`receipts rules draft --flows` runs it (a subprocess): writes only, field values as JSON with secret-named
ones left out and token-shaped ones REDACTED, no header value; a file that is no flow file: exit 2.
"""

from __future__ import annotations

import json
import subprocess
import sys

from mitmproxy import http
from mitmproxy.io import FlowWriter
from mitmproxy.test import tflow

from proxy_addon.draft.request_shapes import read_shape_lines
from tests.conftest import ROOT, SECRETS


def flow(method: str, url: str, body: dict | None, status: int | None) -> http.HTTPFlow:
    f = tflow.tflow()
    headers: dict[str | bytes, str | bytes] = {
        "content-type": "application/json",
        "authorization": SECRETS["authorization"],
        "content-encoding": "gzip",
    }
    f.request = http.Request.make(method, url, b"", headers)
    f.request.content = json.dumps(body).encode() if body is not None else b""  # gzip-encoded on the wire
    f.response = http.Response.make(status, b"{}") if status else None
    return f


def run(path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "proxy_addon.mitm.flow_file", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def test_a_flow_file_gives_the_shapes_of_its_writes(tmp_path):
    path = tmp_path / "session.flows"
    with path.open("wb") as fo:
        w = FlowWriter(fo)
        w.add(flow("POST", "https://api.shop.test/v1/orders", {"sku": "a", "api_key": SECRETS["api-key"]}, 201))
        w.add(flow("GET", "https://api.shop.test/v1/orders", None, 200))
        w.add(flow("POST", "https://api.shop.test/v1/orders", {"sku": "sk_live_" + "x" * 24}, None))
    done = run(path)
    assert done.returncode == 0, done.stderr
    for secret in SECRETS.values():
        assert secret not in done.stdout
    shapes = list(read_shape_lines(done.stdout.splitlines(), "out"))
    assert [(s.method, s.path, s.status) for s in shapes] == [("POST", "/v1/orders", 201), ("POST", "/v1/orders", None)]
    assert shapes[0].fields == {"sku": '"a"', "api_key": None}  # decoded from gzip; the secret has no value
    assert shapes[1].fields == {"sku": "REDACTED"}  # token-shaped
    assert not shapes[0].hashed and shapes[0].credential_headers == ("authorization",)


def test_a_file_that_is_no_flow_file_exits_2_naming_it(tmp_path):
    path = tmp_path / "noise.flows"
    path.write_bytes(b"12:not a tnetstring at all")
    done = run(path)
    assert done.returncode == 2 and done.stdout == ""
    assert f"{path}: not a mitmproxy flow file" in done.stderr
