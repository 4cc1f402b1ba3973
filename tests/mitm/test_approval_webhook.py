"""The approval webhook's and links' options, as the addons take them (taddons, no sockets but the link endpoint's)."""

from __future__ import annotations

import pytest
from mitmproxy import exceptions

from proxy_addon.mitm.approval_webhook import SECRET_ENV, shown


def addon(tctx, name: str):
    found = tctx.master.addons.get(name)
    assert found is not None
    return found


async def test_a_webhook_needs_a_secret_and_an_http_url(setup, monkeypatch, tmp_path):
    addon_, tctx, _ = setup
    monkeypatch.delenv(SECRET_ENV, raising=False)
    with pytest.raises(exceptions.OptionsError, match="needs a secret to sign its notices"):
        tctx.configure(addon(tctx, "approvalwebhook"), receipts_approval_webhook="https://hooks.example/x")
    with pytest.raises(exceptions.OptionsError, match="is not an http"):
        tctx.configure(addon(tctx, "approvalwebhook"), receipts_approval_webhook="ftp://hooks.example/x")
    empty = tmp_path / "empty.secret"
    empty.write_text("\n")
    with pytest.raises(exceptions.OptionsError, match="is empty"):
        tctx.configure(
            addon(tctx, "approvalwebhook"),
            receipts_approval_webhook="https://hooks.example/x",
            receipts_approval_webhook_secret=str(empty),
        )
    monkeypatch.setenv(SECRET_ENV, "s3cret")
    tctx.configure(
        addon(tctx, "approvalwebhook"),
        receipts_approval_webhook="https://hooks.example/x",
        receipts_approval_webhook_secret="",
    )
    assert addon_.approvals.notify is not None
    tctx.configure(addon(tctx, "approvalwebhook"), receipts_approval_webhook="")
    assert addon_.approvals.notify is None


def test_a_webhook_url_is_logged_by_its_host_only():
    assert shown("https://hooks.slack.com/services/T0/B0/SECRETPART") == "https://hooks.slack.com/…"
    assert shown("http://127.0.0.1:8080/hook?token=x") == "http://127.0.0.1:8080/…"


async def test_the_links_base_url_is_the_endpoint_s_unless_given(setup):
    _, tctx, _ = setup
    server = addon(tctx, "approvalserver")
    assert server.base_url() is None  # neither listening nor given: no links
    with pytest.raises(exceptions.OptionsError, match="receipts_approval_listen: 'nowhere' is not HOST:PORT"):
        tctx.configure(server, receipts_approval_listen="nowhere")
    tctx.configure(server, receipts_approval_listen="127.0.0.1:0")
    try:
        base = server.base_url()
        assert base is not None and base.startswith("http://127.0.0.1:") and not base.endswith(":0")
        tctx.configure(server, receipts_approval_url="https://approvals.internal/")
        assert server.base_url() == "https://approvals.internal"
    finally:
        tctx.configure(server, receipts_approval_listen="", receipts_approval_url="")
    assert server.base_url() is None
