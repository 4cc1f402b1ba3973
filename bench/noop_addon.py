"""
The baseline's do-nothing mitmproxy script: `mitmdump -s bench/noop_addon.py`.

It has no per-request hook at all, so the baseline pays for loading a script (as the
addon run does) and nothing else. `running` only says when the proxy is up.
"""

import logging


def running() -> None:
    logging.getLogger("bench").info("bench-noop: ready")
