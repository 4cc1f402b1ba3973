"""
docs/options.md, written from the options' declarations (mitm/options.py: `OPTIONS`):
`python -m proxy_addon.mitm.options_reference > docs/options.md` (`scripts/docs` writes it, and docs/cli.md).
A test fails while the page differs from `render()`.
"""

from __future__ import annotations

from typing import Any

from proxy_addon.gate.paths import DEFAULT_RULES
from proxy_addon.mitm.options import OPTIONS, POSITIVE, Option

HEADER = """\
# Options

Generated from the options' declarations (`proxy_addon/mitm/options.py`) by `scripts/docs`: do not edit
by hand. Every option is a mitmproxy option: `--set name=value` on the command line
(`scripts/run -- --set receipts_upstream_timeout=60`), or mitmweb's Options tab while the proxy runs. A
bad value stops the proxy at startup with one line naming the option. Times are in seconds, sizes in
bytes.

| option | type | default | what it does |
|---|---|---|---|
"""

FOOTER = """
What the size bounds mean for memory and for the agent: [limits.md](limits.md). What the reconcile
options change: [What a read decides](rules.md#what-a-read-decides).

mitmproxy's own options apply too; those that matter here: `listen_host` and `listen_port` (keep the
proxy on 127.0.0.1: [running.md](running.md)), `ssl_verify_upstream_trusted_ca`, `ssl_insecure`
([Upstream TLS](running.md#upstream-tls)), `confdir` (the CA), `http2`, `mode` (`upstream:`).
"""


def render() -> str:
    """The whole of docs/options.md."""
    rows = [f"| `{o.name}` | {_type(o)} | {_default(o.default)} | {_cell(o.help)} |" for o in OPTIONS]
    return HEADER + "\n".join(rows) + "\n" + FOOTER


def _type(o: Option) -> str:
    if o.choices:
        return "one of " + ", ".join(f"`{c}`" for c in o.choices)
    if o.typespec is bool:
        return "`true` or `false`"
    if o.typespec is int:
        return "a positive number" if o.name in POSITIVE else "a number"
    return "text"


def _default(value: Any) -> str:
    if value == DEFAULT_RULES:
        return "`rules/` of this checkout"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value == "":
        return "empty"
    return f"`{value}`"


def _cell(text: str) -> str:
    """One Markdown table cell: no newline, no bare `|`."""
    return " ".join(text.split()).replace("|", "\\|")


if __name__ == "__main__":
    print(render(), end="")
