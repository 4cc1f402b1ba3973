"""Our log lines and mitmproxy's deprecated `add_log` event (internals.skip_legacy_log_events)."""

from __future__ import annotations

import asyncio
import logging

from tests.mitm.conftest import running


class Listener:
    """An addon with the deprecated `add_log` hook: it must still get our lines."""

    def __init__(self) -> None:
        self.entries: list[str] = []

    def add_log(self, entry) -> None:
        self.entries.append(entry.msg)


async def _delivered(listener: Listener, text: str) -> bool:
    for _ in range(50):  # the event is scheduled on the loop (call_soon_threadsafe)
        if any(text in m for m in listener.entries):
            return True
        await asyncio.sleep(0.01)
    return False


async def test_our_lines_skip_add_log_unless_an_addon_listens(tmp_path, caplog):
    async with running(tmp_path) as (_, tctx):
        master = tctx.master
        events: list[str] = []
        real_trigger = master.addons.trigger

        def trigger(event):
            events.append(event.name)
            return real_trigger(event)

        master.addons.trigger = trigger
        ours, theirs = logging.getLogger("proxy_addon.mitm.receipts_addon"), logging.getLogger("mitmproxy.proxy.server")

        ours.warning("receipt r-1: ours, nobody listens")
        theirs.warning("theirs, nobody listens")
        await asyncio.sleep(0.05)
        assert events.count("add_log") == 1  # mitmproxy's own line keeps its event; ours skips it
        assert "ours, nobody listens" in caplog.text  # ...and still reaches every logging handler

        listener = Listener()
        master.addons.add(listener)  # a script with add_log, loaded later: our lines go to it again
        ours.warning("receipt r-2: ours, with a listener")
        assert await _delivered(listener, "ours, with a listener")

        master.addons.remove(listener)
        events.clear()
        ours.warning("receipt r-3: ours, listener gone")
        await asyncio.sleep(0.05)
        assert "add_log" not in events
