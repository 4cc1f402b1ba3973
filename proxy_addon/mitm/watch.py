"""
Once a second, while the proxy runs: follow receipts changed elsewhere, and reload changed rules.

- Flows shown in mitmweb keep their marker and comment in step with receipts that another
  process (the CLI, a second proxy) changed: the state changes are followed by their events'
  ids (a search of a primary key, whatever the size of the database), re-reading the last
  LOOKBACK of them, since PostgreSQL hands out ids before its transactions commit.
- A rules file that changed is loaded again once it has stopped changing (the same names,
  sizes and times on two ticks in a row), at most once every RELOAD_EVERY seconds, and in a
  worker thread: no rules file, however large or slow to load, stalls traffic, and a file
  rewritten every few milliseconds keeps nobody busy. A bad edit keeps the last good rules:
  it is logged as an ERROR (mitmweb's event log shows it as one: Options → View Options →
  Display Event Log) naming each problem as `receipts rules check` does, and every matched flow
  until the rules load again says in its comment that the last good rules decided it.
  mitmproxy's `allow_hosts` follows the rules: only the hosts they name are TLS-intercepted,
  unless receipts_intercept_all is on or the user set allow_hosts or ignore_hosts themselves.
- Which earlier fingerprint versions the receipts hold (intent/earlier_fingerprints.py) is read again
  with each rules load, before the new rules take over (a load that cannot read it keeps the
  last good rules), and every VERSIONS_EVERY seconds: receipts resolve, and another proxy of a
  fleet may add some. Unresolved receipts that the new rules treat otherwise are named in a WARNING.
"""

from __future__ import annotations

import asyncio
import logging

from mitmproxy import ctx

from proxy_addon.errors import ReceiptsError, RulesError
from proxy_addon.mitm.receipts_addon import Receipts
from proxy_addon.rules import RuleSet, check_rules_path, host_pattern, load_rules_path, rules_signature
from proxy_addon.rules.placeholders import placeholders
from proxy_addon.rules.todo_comments import todo_summary

logger = logging.getLogger(__name__)

RELOAD_EVERY = 2.0  # seconds between two rules reloads, at the least
LOOKBACK = 256  # events before the last one followed that each tick reads again (a commit that came late)
PROBLEMS_LOGGED = 10  # problems a failed reload's error line lists, at most
VERSIONS_EVERY = 30  # seconds between two reads of the fingerprint versions the receipts hold


def load_or_problems(path: str) -> tuple[RuleSet | None, list[RulesError]]:
    """The rules at `path`; else None and every problem that keeps them from loading, in file and
    line order. In a worker thread; rules that do not load are read a second time to list them."""
    try:
        return load_rules_path(path), []
    except RulesError as first:
        problems = check_rules_path(path, strict=False)[1]
        return None, problems if any(str(p) == str(first) for p in problems) else [first, *problems]


class Watch:
    def __init__(self, receipts: Receipts):
        self.receipts = receipts
        self._task: asyncio.Task | None = None
        self._allow_hosts: list[str] = []  # the allow_hosts we derived from the rules
        self._seen: tuple = ()  # the rules files' signature on the previous tick
        self._last_reload = float("-inf")
        self._followed: set[int] = set()  # ids of the events followed, the last LOOKBACK of them
        self._reader: object | None = None  # the read connection they came from (another: another database)

    def configure(self, updated: set[str]) -> None:
        self.sync_allow_hosts()

    def running(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._watch())

    def done(self) -> None:
        if self._task:
            self._task.cancel()

    async def _watch(self) -> None:
        after = None
        ticks = 0
        while True:
            await asyncio.sleep(1)
            ticks += 1
            after = self.follow_receipts(after)
            if ctx.options.receipts_watch_rules:
                await self.reload_rules()
            if ticks % VERSIONS_EVERY == 0:
                await self.refresh_versions()

    async def refresh_versions(self) -> None:
        """Read again which earlier fingerprint versions the receipts hold (for the rules in force)."""
        gate, rules = self.receipts.gate, self.receipts.rules
        if gate is None or rules is None:
            return
        try:
            await gate.refresh_versions(rules)
        except ReceiptsError as e:  # the last versions read stay: they only ever shrink, unless a fleet adds
            logger.warning(f"receipt-proxy: could not read the fingerprint versions the receipts hold: {e}")

    def follow_receipts(self, after: int | None) -> int | None:
        """
        Refresh the flows of receipts whose state changed in the events after `after` (an event
        id; None: from now on); the id to follow from next.
        """
        reader = self.receipts.reader()
        if ctx.master.addons.get("view") is None or reader is None:
            return after
        if self._reader is not None and reader is not self._reader:  # receipts_db names another database
            after, self._followed = None, set()
        self._reader = reader
        try:
            if after is None:  # from now on
                return reader.last_event_id()
            changes = reader.transitions_after(max(after - LOOKBACK, 0))
        except ReceiptsError as e:
            logger.debug(f"receipt-proxy: could not follow receipts: {e}")
            return after
        changed: dict[str, None] = {}  # receipt ids, in the order of their changes
        for event_id, operation_id in changes:
            if event_id not in self._followed:
                self._followed.add(event_id)
                after = max(after, event_id)
                changed[operation_id] = None
        self._followed = {i for i in self._followed if i > after - LOOKBACK}
        for operation_id in changed:  # each as it is now: once is enough
            try:
                receipt = reader.get(operation_id)
            except ReceiptsError as e:  # pruned meanwhile, or the database went away: nothing to show
                logger.debug(f"receipt-proxy: could not follow receipt {operation_id}: {e}")
                continue
            self.receipts.refresh_flow(receipt)
        return after

    async def reload_rules(self) -> None:
        """Load changed rules files again, off the event loop, once they have settled."""
        path = ctx.options.receipts_rules
        sig = await asyncio.to_thread(rules_signature, path)
        settled, self._seen = sig == self._seen, sig
        loop = asyncio.get_running_loop()
        if sig == self.receipts.rules_sig or not settled or loop.time() - self._last_reload < RELOAD_EVERY:
            return
        self._last_reload = loop.time()
        self.receipts.rules_sig = sig
        last_good = len(self.receipts.rules.operations) if self.receipts.rules else 0
        keeping = f"matched requests stay on the last good rules ({last_good} operations) until they load"
        try:
            rules, problems = await asyncio.to_thread(load_or_problems, path)
        except Exception as e:  # the watcher must outlive any surprise
            self.receipts.rules_problem = str(path)
            self.receipts.metrics.reloaded(False)
            logger.exception(f"receipt-proxy: rules NOT reloaded from {path}; {keeping}: {type(e).__name__}: {e}")
            return
        if rules is None:
            self.receipts.metrics.reloaded(False)
            first = problems[0]
            self.receipts.rules_problem = first.source + (f":{first.line}" if first.line else "")
            listed = "; ".join(str(p) for p in problems[:PROBLEMS_LOGGED])
            more = f"; and {len(problems) - PROBLEMS_LOGGED} more" if len(problems) > PROBLEMS_LOGGED else ""
            n = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
            logger.error(f"receipt-proxy: rules NOT reloaded from {path}; {keeping}. {n}: {listed}{more}")
            return
        gate = self.receipts.gate
        try:  # before the new rules take over: their earlier fingerprint versions (see the module docstring)
            versions = await gate.refresh_versions(rules) if gate is not None else None
        except ReceiptsError as e:
            self.receipts.rules_sig = ()  # tried again at the next tick
            self.receipts.metrics.reloaded(False)
            logger.error(
                f"receipt-proxy: rules NOT reloaded from {path}; {keeping}: cannot read the fingerprint versions "
                f"the receipts hold: {e}"
            )
            return
        self.receipts.rules, self.receipts.rules_problem = rules, None
        for line in versions.warnings() if versions is not None else ():
            logger.warning(f"receipt-proxy: {line}")
        self.receipts.metrics.reloaded(True)
        self.receipts.metrics.known(rules.operations)
        logger.warning(f"receipt-proxy: rules reloaded from {path}: {len(rules.operations)} operations")
        for warning in await asyncio.to_thread(lambda: [*placeholders(path), *todo_summary(path)]):
            logger.warning(f"receipt-proxy: {warning}")
        self.sync_allow_hosts()

    def sync_allow_hosts(self) -> None:
        opts, rules = ctx.options, self.receipts.rules
        if rules is None or "allow_hosts" not in opts:
            return
        wanted = [] if opts.receipts_intercept_all else sorted({host_pattern(h) for f in rules.files for h in f.hosts})
        current = list(opts.allow_hosts)
        if opts.ignore_hosts or (current and current != self._allow_hosts):
            return  # the user's choice
        if current != wanted:
            self._allow_hosts = wanted
            opts.update(allow_hosts=wanted)
