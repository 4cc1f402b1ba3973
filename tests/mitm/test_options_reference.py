"""
docs/options.md is generated from the options' declarations (mitm/options_reference.py): it must be what
`render()` writes today, and cover every `receipts_*` option the addons register with mitmproxy.
"""

from __future__ import annotations

from mitmproxy.test import taddons

from proxy_addon.mitm import make_addons
from proxy_addon.mitm.options import OPTIONS
from proxy_addon.mitm.options_reference import render
from tests.conftest import ROOT

DOC = ROOT / "docs" / "options.md"


def test_docs_options_md_is_what_the_declarations_make():
    assert DOC.read_text() == render(), "docs/options.md is stale: run scripts/docs"


def test_every_registered_option_is_documented_with_its_default_and_help():
    with taddons.context() as tctx:
        tctx.options.add_option("connection_strategy", str, "eager", "as the proxyserver addon declares it")
        tctx.master.addons.add(*make_addons())
        registered = {name for name in sorted(tctx.options.keys()) if name.startswith("receipts_")}
    rows = {line.split("`")[1]: line for line in render().splitlines() if line.startswith("| `receipts_")}
    assert set(rows) == registered == {o.name for o in OPTIONS}
    for o in OPTIONS:
        assert " ".join(o.help.split()) in rows[o.name]
        shown = "empty" if o.default == "" else str(o.default).lower() if isinstance(o.default, bool) else o.default
        assert f"| {shown} |" in rows[o.name] or f"`{shown}`" in rows[o.name] or o.name == "receipts_rules"
