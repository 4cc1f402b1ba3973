"""The mitmproxy layer driven with mitmproxy's own test helpers (taddons, tflow): no sockets."""

from __future__ import annotations

import contextlib

import pytest
from mitmproxy import http
from mitmproxy.flow import Error
from mitmproxy.test import taddons, tflow

from proxy_addon.mitm import make_addons
from proxy_addon.mitm.receipts_addon import Receipts

RULES = """\
api: shop
hosts: [api.shop.test]
operations:
  orders.create:
    match: {method: POST, path: /v1/orders}
    fingerprint: {body: [sku]}
    external_id: order.id
  refunds.create:
    match: {method: POST, path: /v1/refunds}
    fingerprint: {body: [sku]}
    approve: true
"""


@contextlib.asynccontextmanager
async def running(tmp_path, rules_text: str = RULES):
    """The addons loaded in mitmproxy's test context with these rules, forwarding left to mitmproxy."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(rules_text)
    addons = make_addons()
    addon = addons[0]
    assert isinstance(addon, Receipts)
    with taddons.context() as tctx:
        tctx.options.add_option("connection_strategy", str, "eager", "as the proxyserver addon declares it")
        tctx.master.addons.add(*addons)  # load() switches it to lazy
        tctx.configure(
            addon,
            receipts_db=str(tmp_path / "r.db"),
            receipts_rules=str(rules),
            receipts_watch_rules=False,
            receipts_forward="mitmproxy",
        )
        tctx.commands = addons[1]  # the receipts.* commands addon
        try:
            yield addon, tctx
        finally:
            await addon.done()


@pytest.fixture
async def setup(tmp_path):
    async with running(tmp_path) as (addon, tctx):
        yield addon, tctx, tmp_path


def order(sku: str = "A-1", path: str = "/v1/orders") -> http.HTTPFlow:
    f = tflow.tflow()
    headers: dict[str | bytes, str | bytes] = {"content-type": "application/json", "authorization": "Bearer t0k3n"}
    f.request = http.Request.make("POST", f"https://api.shop.test{path}", f'{{"sku": "{sku}"}}', headers)
    f.response = None
    return f


async def send(addon: Receipts, f: http.HTTPFlow) -> None:
    addon.requestheaders(f)
    await addon.request(f)


async def held(addon: Receipts, f: http.HTTPFlow):
    """Send `f` and return the request hook's task once the approval gate holds the flow."""
    import asyncio

    from tests.conftest import deadline

    addon.requestheaders(f)
    task = asyncio.create_task(addon.request(f))
    for _ in range(int(deadline(1) / 0.01)):
        await asyncio.sleep(0.01)
        if f.intercepted:
            break
    assert f.intercepted, "the flow was not held for approval"
    return task


async def unknown(addon, sku: str) -> http.HTTPFlow:
    f = order(sku)
    await send(addon, f)
    f.error = Error("server closed connection")
    f.server_conn.timestamp_tcp_setup = f.server_conn.timestamp_tls_setup = 1.0
    await addon.error(f)
    return f
