"""
The Prometheus endpoint's server (mitm/metrics_server.py) in mitmproxy's test context: a change at run
time (as mitmweb's Options tab makes it) moves the endpoint, and a bad value or a busy port is refused
while the old endpoint keeps serving. `scrape` and `by` read an endpoint with prometheus_client's own
parser (tests/e2e/proxy/test_metrics.py uses them too).
"""

from __future__ import annotations

import socket

import httpx
import pytest
from mitmproxy import exceptions
from prometheus_client.parser import text_string_to_metric_families

from proxy_addon.mitm.metrics_server import MetricsServer
from tests.mitm.conftest import setup  # noqa: F401  (the taddons fixture, for the run-time change)
from tests.upstream import free_port


def scrape(url: str) -> tuple[str, dict[str, list[tuple[dict[str, str], float]]]]:
    """The exposition text, and each sample name's (labels, value) pairs."""
    answer = httpx.get(url, timeout=5, trust_env=False)
    assert answer.status_code == 200
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(answer.text):
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return answer.text, samples


def by(samples: dict, name: str, *labels: str, zeros: bool = False) -> dict[tuple[str, ...], float]:
    """A sample's values keyed by the given labels' values (zeros left out unless asked for)."""
    return {tuple(lbl[k] for k in labels): v for lbl, v in samples.get(name, []) if v or zeros}


async def test_a_change_at_run_time_moves_the_endpoint_and_a_refused_one_keeps_it(setup):  # noqa: F811
    """As mitmweb's Options tab changes it: a bad value or a busy port is refused, the old endpoint keeps serving."""
    _, tctx, _ = setup
    server = next(a for a in tctx.master.addons.chain if isinstance(a, MetricsServer))
    first, second = free_port(), free_port()
    get = lambda port: httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5, trust_env=False)  # noqa: E731
    tctx.configure(server, receipts_metrics=f"127.0.0.1:{first}")
    try:
        assert "receipt_proxy_rules_last_reload_successful 1.0" in get(first).text
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            busy = taken.getsockname()[1]
            with pytest.raises(
                exceptions.OptionsError, match=f"receipts_metrics: cannot serve metrics at 127.0.0.1:{busy}"
            ):
                tctx.configure(server, receipts_metrics=f"127.0.0.1:{busy}")
        with pytest.raises(exceptions.OptionsError, match="receipts_metrics: 'nonsense' is not HOST:PORT"):
            tctx.configure(server, receipts_metrics="nonsense")
        assert get(first).status_code == 200  # still served where it was
        tctx.configure(server, receipts_metrics=f"127.0.0.1:{second}")
        assert get(second).status_code == 200
        with pytest.raises(httpx.ConnectError):
            get(first)
        tctx.configure(server, receipts_metrics="")
        with pytest.raises(httpx.ConnectError):
            get(second)
    finally:
        server.done()
