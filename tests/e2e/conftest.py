"""
Fixtures of the end-to-end tests (everything under tests/e2e/, marked `e2e`): the session's
mitmproxy confdir (its CA), one shared proxy, and the clients that send through it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.processes import Clients, Proxy


@pytest.fixture(scope="session")
def confdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("mitmproxy-conf")


@pytest.fixture(scope="session")
def proxy(tmp_path_factory, confdir, tls_upstream):
    """One shared proxy for the tests that only need a proxy; each test uses its own bucket."""
    p = Proxy(tmp_path_factory.mktemp("proxy"), confdir, upstream_ca=tls_upstream.cert_path)
    p.start()
    yield p
    p.stop()


@pytest.fixture
def clients(proxy) -> Clients:
    return Clients(proxy)
