"""
A real browser on mitmweb: `scripts/run` (mitmweb with the addon) in front of the test upstream,
a write the upstream drops, its identical retry blocked with 409, and headless Chromium
checking what a user sees in mitmweb: the ⛔ marker in the flow list, the comment, the
original receipt id in the details and the Receipt content view. It also saves the
screenshot docs/mitmweb.md shows: docs/mitmweb-blocked-duplicate.png.

Needs Debian's Chromium at /usr/bin/chromium (`apt-get install chromium`) and the Python
`playwright` package (the `test` extra); it never downloads a browser. Without an emoji font
(`fonts-noto-color-emoji`) Chromium draws ⛔ as an empty box in the screenshot; the
assertions read the DOM and do not depend on fonts.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import requests

from tests.conftest import ROOT
from tests.e2e.processes import mitmweb

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip(
        f"{CHROMIUM} is missing (install Debian's chromium: apt-get install -y chromium)", allow_module_level=True
    )
try:
    from playwright.sync_api import expect, sync_playwright
except ImportError as e:
    pytest.skip(f"the playwright package cannot be imported ({e}); install the test extra", allow_module_level=True)

# The picture in docs/mitmweb.md is refreshed only on request, so that a test run leaves the tree clean:
# RECEIPTS_SCREENSHOT=1 scripts/test tests/e2e/run/test_browser.py
SCREENSHOT = ROOT / "docs" / "mitmweb-blocked-duplicate.png"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
BLOCKED = "⛔"  # :no_entry:, as mitmweb draws the marker
UNKNOWN = "⚠"  # :warning: (mitmproxy's emoji table has no variation selector here)


def test_mitmweb_shows_a_blocked_duplicate_and_its_receipt(tmp_path, confdir, upstream, bucket):
    path = f"/api/{bucket}/plain"  # plain.create: no reconcile spec, so an unknown outcome stays blocked
    url = f"{upstream.url}{path}"
    body = {"title": "Launch announcement"}
    with mitmweb(tmp_path, confdir) as (proxy_url, web_url):
        proxies = {"http": proxy_url, "https": proxy_url}

        # The first attempt reaches the upstream, which commits it and hangs up: outcome unknown.
        upstream.plan(path, "drop")
        first = requests.post(url, json=body, proxies=proxies, timeout=10)
        assert first.status_code == 502, first.text
        assert first.headers["X-Receipt-State"] == "outcome_unknown"
        receipt_id = first.headers["X-Receipt-Id"]
        assert upstream.commits(path) == 1

        # The identical retry is blocked, and never reaches the upstream.
        retry = requests.post(url, json=body, proxies=proxies, timeout=10)
        assert retry.status_code == 409, retry.text
        assert retry.json()["error"] == "duplicate_unresolved"
        assert retry.json()["operation_id"] == receipt_id
        assert upstream.seen(path) == 1
        comment = f"BLOCKED duplicate · test-api plain.create · receipt {receipt_id}: outcome_unknown"

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                page.set_default_timeout(10_000)
                expect.set_options(timeout=10_000)
                page.goto(web_url)

                # The flow list: both attempts, the retry with the ⛔ marker, the first with ⚠.
                rows = page.locator(".flow-table tbody tr", has_text=path)
                blocked = rows.filter(has=page.locator(".marker", has_text=BLOCKED))
                expect(blocked).to_have_count(1)
                expect(blocked.locator("td.col-status")).to_have_text("409")
                expect(rows.filter(has=page.locator(".marker", has_text=UNKNOWN))).to_have_count(1)
                if blocked.locator("td.col-comment").count():  # only with web_columns including "comment"
                    expect(blocked.locator("td.col-comment")).to_contain_text(comment)

                # What the list is drawn from: mitmweb's flows API (the page's own token cookie).
                flows = json.loads(page.evaluate("async () => (await fetch('./flows')).text()"))
                listed = [
                    f
                    for f in flows
                    if f["request"]["path"] == path and (f.get("response") or {}).get("status_code") == 409
                ]
                assert [(f["marked"], f["comment"]) for f in listed] == [(BLOCKED, comment)], listed

                # Its details: the comment, the receipt header and the Receipt view of the original receipt.
                blocked.click()
                detail = page.locator(".flow-detail")
                detail.locator("nav a", has_text="Comment").click()
                expect(detail.locator("section")).to_contain_text(comment)

                detail.locator("nav a", has_text="Response").click()
                response = detail.locator("section.response")
                expect(response.locator(".kv-row", has_text="X-Receipt-Id")).to_contain_text(receipt_id)
                view = response.locator(".contentview")
                heading = view.locator(".controls h5")
                # mitmproxy picks the Receipt view by itself for the proxy's own answers ("auto").
                expect(heading).to_have_text("Receipt")
                # It is also offered in the view menu (lower-case, as mitmproxy registers views): choose it.
                view.locator(".controls a", has_text="View:").click()
                menu = page.locator(".dropdown-menu.is-open")
                expect(menu.locator("a", has_text=re.compile(r"^receipt$"))).to_have_count(1)
                menu.locator("a", has_text=re.compile(r"^receipt$")).click()
                expect(view.locator(".controls a", has_text="View:")).to_contain_text("receipt")
                expect(heading).to_have_text("Receipt")
                rendered = view.locator("pre")
                expect(rendered).to_contain_text(f"duplicate of receipt {receipt_id}")
                expect(rendered).to_contain_text(f"receipt          {receipt_id}")
                expect(rendered).to_contain_text("history:")
                expect(rendered).to_contain_text("submitted → outcome_unknown")
                expect(rendered).to_contain_text("blocked duplicate")

                # The picture for docs/mitmweb.md: the list with the blocked flow selected and its receipt.
                page.mouse.move(0, 0)  # no hover highlight in the picture
                SCREENSHOT.parent.mkdir(exist_ok=True)
                shot = SCREENSHOT if os.environ.get("RECEIPTS_SCREENSHOT") else tmp_path / SCREENSHOT.name
                page.screenshot(path=str(shot), full_page=True)
                assert shot.stat().st_size > 10_000
            finally:
                browser.close()
