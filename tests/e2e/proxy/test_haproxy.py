"""
The fleet recipe (docs/fleet/haproxy.cfg, docs/fleet.md, "Run a fleet"): HAProxy in TCP mode in front
of two proxies on one PostgreSQL store. Identical writes sent through HAProxy, spread over
both proxies, make one upstream write. Skips with a clear reason where haproxy is missing
(.ci/run installs Debian's package) or there is no PostgreSQL.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, wait_for
from tests.e2e.processes import Clients, Proxy, start_all
from tests.upstream import free_port

RECIPE = ROOT / "docs" / "fleet" / "haproxy.cfg"


def recipe_with_ports(listen: int, servers: list[int]) -> str:
    """The documented recipe, with the test's ports in place of 8080 and the proxies'."""
    text = RECIPE.read_text().replace("127.0.0.1:8080", f"127.0.0.1:{listen}")
    lines = [line for line in text.splitlines() if not re.match(r"\s+server proxy\d", line)]
    lines += [f"    server proxy{i + 1} 127.0.0.1:{port} check inter 2s" for i, port in enumerate(servers)]
    return "\n".join(lines) + "\n"


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_two_proxies_behind_haproxy_make_one_upstream_write(pg_url, tmp_path, confdir, upstream, bucket):
    haproxy = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
    if haproxy is None:
        pytest.skip("HAProxy recipe not tested: haproxy is not installed (apt-get install haproxy)")
    key = tmp_path / "fleet.key"
    proxies = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        proxies.append(Proxy(tmp_path / name, confdir, db=pg_url, extra=("--set", f"receipts_secret={key}")))
    start_all(proxies)
    port = free_port()
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(recipe_with_ports(port, [p.port for p in proxies]))
    log = open(tmp_path / "haproxy.out", "wb")  # noqa: SIM115 - HAProxy writes to it until the finally closes it
    ha = subprocess.Popen([haproxy, "-db", "-f", str(cfg)], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: listening(port) or ha.poll() is not None, what="haproxy to listen")
        assert ha.poll() is None, (tmp_path / "haproxy.out").read_text()
        # What Clients sends through: HAProxy's port, the proxies' CA (one confdir) and the first proxy's log
        # (for the end-of-run sweep); a Proxy never started.
        front = Proxy(tmp_path, confdir, db=pg_url)
        front.port, front.log_path = port, proxies[0].log_path
        path = f"/api/{bucket}/plain"
        upstream.plan(path, "held")
        answers: list = [None] * 10

        def send(i):
            answers[i] = Clients(front).send("requests", "POST", upstream.url + path, {"via": "haproxy"}, timeout=30)

        threads = [threading.Thread(target=send, args=(i,)) for i in range(10)]
        for t in threads:
            t.start()
            time.sleep(0.05)
        wait_for(lambda: upstream.seen(path) == 1, what="the first write to reach the upstream")
        time.sleep(1.0)
        upstream.let_go(path)
        for t in threads:
            t.join(timeout=40)
        assert upstream.seen(path) == 1 and upstream.commits(path) == 1
        assert {a.status for a in answers} <= {201, 409}
        assert len({a.headers.get("x-receipt-id") for a in answers}) == 1
        # HAProxy spread the connections: both proxies answered some of them.
        assert all("x-receipt" in p.log() or "receipt " in p.log() for p in proxies)
        served = [p.log().count("duplicate") + p.log().count("succeeded") for p in proxies]
        assert all(n > 0 for n in served), served
    finally:
        upstream.let_go(path)
        ha.terminate()
        ha.wait(timeout=10)
        log.close()
        for p in proxies:
            p.stop()
