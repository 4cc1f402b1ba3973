"""
The mitmproxy addon: receipt committed → forward once → classify → block unresolved duplicates.

    mitmdump -s proxy_addon/addon.py --set receipts_db=./receipts.db --set receipts_rules=./rules

Hooks, one job each:
- `requestheaders`: match a rule; a matched request is never streamed (the receipt
  must be committed before any byte leaves).
- `request`: fingerprint, then commit a `submitted` receipt, or answer from an existing
  one (409 blocked, recorded replay, 503 when the store cannot be written).
- `response` / `error`: classify what happened and record it.
Unmatched requests touch neither the database nor the fingerprint code.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import socket
import sqlite3
import sys
from pathlib import Path
from typing import Any

import httpx
from mitmproxy import command, contentviews, ctx, exceptions, hooks, http
from mitmproxy import flow as mflow
from mitmproxy.flow import Error
from mitmproxy.addonmanager import Loader

if __package__ != "proxy_addon":  # loaded with `mitmdump -s path/to/addon.py` from a checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy_addon import answers, exchange, identity, instances, web
from proxy_addon.classify import classify_error, classify_response, response_external_id
from proxy_addon.errors import IllegalTransition, ReceiptsError, RulesError, StoreError
from proxy_addon.fingerprint import RequestView, fingerprint, keyed_hash, load_or_create_key
from proxy_addon.reconcile import (
    Verdict, credentials_from, describe, finish, judge, key_dedupes, perform_read_async, plan_read, retry_after,
)
from proxy_addon.rules import (
    ALREADY_EXISTS, Match, Operation, RuleSet, host_pattern, load_rules_path, rules_signature,
)
from proxy_addon.paths import DEFAULT_DB, DEFAULT_RULES, key_path
from proxy_addon.states import RESOLUTIONS, State
from proxy_addon.store import Attempt, Decision, Receipt, Store, iso, utcnow

logger = logging.getLogger("receipt_proxy")

META = "receipts"  # flow.metadata key: a plain, serializable dict

OPTIONS: list[tuple[str, type, Any, str]] = [
    ("receipts_db", str, DEFAULT_DB,
     "Path of the SQLite receipts database (created with mode 0600), e.g. --set receipts_db=~/.local/state/receipt-proxy/receipts.db"),
    ("receipts_rules", str, DEFAULT_RULES,
     "A rules file, or a folder whose *.yaml files are loaded, e.g. --set receipts_rules=./rules"),
    ("receipts_secret", str, "",
     "Path of the per-installation HMAC key that hashes credentials into the principal; created on first run with mode 0600. Default: secret.key beside receipts_db"),
    ("receipts_replay_window", int, 86400,
     "Seconds after success during which a duplicate gets the recorded response (after_success: replay), e.g. --set receipts_replay_window=3600"),
    ("receipts_upstream_timeout", int, 300,
     "Seconds to wait for the upstream's answer to a matched request; past that the exchange is ended and the receipt is outcome_unknown"),
    ("receipts_lock_timeout", int, 5,
     "Seconds to wait for a locked receipts database before answering 503 (not sent)"),
    ("receipts_response_cap", int, 1048576,
     "Largest response body (bytes) recorded for replay; a larger success is blocked instead of replayed"),
    ("receipts_read_timeout", int, 30,
     "Seconds a reconcile read (GET/HEAD) may take before the receipt goes to manual_review"),
    ("receipts_wait_submitted", int, 30,
     "Seconds a duplicate of a request still in flight waits for its outcome (then gets the replay, or the 409); 0: answer 409 at once"),
    ("receipts_forward", str, "addon",
     "Who sends matched requests upstream: 'addon' (the exchange survives an agent that hangs up, so the real "
     "outcome is recorded) or 'mitmproxy' (mitmproxy's own forwarding; an agent that hangs up leaves outcome_unknown)"),
    ("receipts_debug_pause", str, "",
     "For crash tests only: pause a matched request at a point, e.g. after_commit:10 (the receipt is committed, "
     "nothing sent) or after_answer:10 (the upstream answered, the receipt not yet updated)"),
    ("receipts_intercept_all", bool, False,
     "Intercept TLS to every host; by default only the hosts named in the rules are intercepted and every other "
     "host is tunnelled untouched (mitmproxy's allow_hosts, derived from the rules)"),
    ("receipts_approval_timeout", int, 300,
     "Seconds a write of an operation with approve: true waits in mitmweb for an operator to resume (approve) "
     "or kill (deny) it; past that it is denied"),
    ("receipts_watch_rules", bool, True,
     "Reload the rules when a rules file changes; a bad edit keeps the last good rules and logs an error"),
]


class Receipts:
    """Writes a durable receipt before forwarding a matched request, and blocks unresolved duplicates."""

    def __init__(self) -> None:
        self.rules: RuleSet | None = None
        self.store: Store | None = None
        self.key: bytes | None = None
        self.instance = ""
        self.config_error: str | None = "receipt-proxy is not configured yet"
        self._config: tuple | None = None
        self._rules_sig: tuple = ()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._instance_lock: int | None = None
        self._watcher: asyncio.Task | None = None
        self._deadlines: dict[str, asyncio.TimerHandle] = {}
        self._reconciles: dict[str, asyncio.Task] = {}  # receipt id → the inline read in progress
        self._client: httpx.AsyncClient | None = None  # sends matched requests (receipts_forward=addon)
        self._outcomes: dict[str, asyncio.Event] = {}  # receipt id → set when its outcome is recorded
        self._allow_hosts: list[str] = []  # the allow_hosts we derived from the rules
        self._read_store: Store | None = None
        self._view = web.ReceiptView(self._reader)
        self._client_config: tuple | None = None

    # --- lifecycle -------------------------------------------------------------------------

    def _reader(self) -> Store | None:
        """A connection for reads on the event loop's thread (the content view, commands)."""
        if self._read_store is None and self.store is not None and self.store.path:
            self._read_store = Store.open(self.store.path, create=False)
        return self._read_store

    def load(self, loader: Loader) -> None:
        contentviews.add(self._view)
        # httpx logs every request URL at INFO, query tokens included; our own lines redact them.
        for name in ("httpx", "httpcore"):
            logging.getLogger(name).setLevel(logging.WARNING)
        for name, typespec, default, help_ in OPTIONS:
            loader.add_option(name, typespec, default, help_)
        _check_deferred_options(loader)
        # With eager connections, upstream failures happen at CONNECT time, outside any flow,
        # and a receipt would never learn of them.
        if "connection_strategy" in loader.master.options:  # absent only without the proxyserver addon
            loader.master.options.update(connection_strategy="lazy")

    def configure(self, updated: set[str]) -> None:
        if getattr(ctx.options, "connection_strategy", "lazy") != "lazy":
            raise exceptions.OptionsError(
                "receipt-proxy needs connection_strategy=lazy, so that every upstream failure reaches a flow"
            )
        opts = ctx.options
        for name in ("receipts_replay_window", "receipts_upstream_timeout", "receipts_response_cap",
                     "receipts_lock_timeout", "receipts_read_timeout", "receipts_approval_timeout"):
            if getattr(opts, name) <= 0:
                raise exceptions.OptionsError(f"{name} must be a positive number, not {getattr(opts, name)}")
        if "receipts_rules" in updated or self.rules is None:
            try:
                sig = rules_signature(opts.receipts_rules)
                rules = load_rules_path(opts.receipts_rules)
            except RulesError as e:
                raise exceptions.OptionsError(f"receipts_rules: {e}") from None
            self.rules, self._rules_sig = rules, sig
            logger.info(f"receipt-proxy: {len(rules.operations)} operations from {opts.receipts_rules}")
        if (opts.receipts_db, opts.receipts_secret, opts.receipts_lock_timeout) != self._config:
            self._open_store()
        self._configure_client()
        self._sync_allow_hosts()
        self.config_error = None

    def _open_store(self) -> None:
        opts = ctx.options
        db = Path(opts.receipts_db).expanduser()
        secret = key_path(db, opts.receipts_secret)
        try:
            db.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            key = load_or_create_key(secret)
            store = Store.open(db, lock_timeout=opts.receipts_lock_timeout)
        except (ReceiptsError, OSError, ValueError) as e:
            raise exceptions.OptionsError(f"receipts_db: {e}") from None
        instance, lock_fd = instances.claim(db)
        old_store, old_lock, old_executor = self.store, self._instance_lock, self._executor
        if self._read_store is not None:
            self._read_store.close()
            self._read_store = None
        self.store, self.key, self.instance, self._instance_lock = store, key, instance, lock_fd
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="receipts-store")
        self._config = (opts.receipts_db, opts.receipts_secret, opts.receipts_lock_timeout)
        recovered = self._executor.submit(
            store.recover_in_flight, is_alive=lambda i: i == instance or instances.alive(db, i)
        ).result()
        for operation_id in recovered:
            logger.warning(f"receipt {operation_id}: left behind by a stopped proxy; now "
                           f"{self._executor.submit(store.get, operation_id).result().state}")
        if old_executor:
            old_executor.submit(old_store.close)
            old_executor.shutdown(wait=False)
        if old_lock is not None:
            os.close(old_lock)
        logger.info(f"receipt-proxy: receipts in {db} (instance {instance})")

    def _sync_allow_hosts(self) -> None:
        """
        Intercept TLS only for the hosts the rules name: every other host is tunnelled untouched
        (mitmproxy's allow_hosts), unless receipts_intercept_all is on or the user set
        allow_hosts or ignore_hosts themselves.
        """
        opts = ctx.options
        if self.rules is None or "allow_hosts" not in opts:
            return
        wanted = [] if opts.receipts_intercept_all else sorted({host_pattern(h) for f in self.rules.files for h in f.hosts})
        current = list(opts.allow_hosts)
        if opts.ignore_hosts or (current and current != self._allow_hosts):
            return  # the user's choice
        if current != wanted:
            self._allow_hosts = wanted
            opts.update(allow_hosts=wanted)

    def _configure_client(self) -> None:
        opts = ctx.options
        point, _, seconds = opts.receipts_debug_pause.partition(":")
        if opts.receipts_debug_pause and (point not in ("after_commit", "after_answer") or not seconds.isdigit()):
            raise exceptions.OptionsError(f"receipts_debug_pause: {opts.receipts_debug_pause!r} is not after_commit:N or after_answer:N")
        if opts.receipts_forward not in ("addon", "mitmproxy"):
            raise exceptions.OptionsError(f"receipts_forward must be 'addon' or 'mitmproxy', not {opts.receipts_forward!r}")
        if opts.receipts_forward == "addon" and (why := exchange.unsupported(opts)):
            raise exceptions.OptionsError(why)
        config = (opts.receipts_forward, *(repr(getattr(opts, name, None)) for name in exchange.CLIENT_OPTIONS))
        if config == self._client_config:
            return
        old, self._client_config = self._client, config
        self._client = exchange.make_client(opts) if opts.receipts_forward == "addon" else None
        if old is not None:
            asyncio.get_running_loop().create_task(old.aclose())

    def running(self) -> None:
        logger.info(f"receipt-proxy: ready ({'NOT configured: ' + self.config_error if self.config_error else 'recording'})")
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def done(self) -> None:
        # mitmproxy 12 cannot unregister a content view (contentviews.remove is a no-op); a reloaded
        # script registers its view again under the same name, which replaces this one.
        if self._read_store is not None:
            self._read_store.close()
        if self._client is not None:
            await self._client.aclose()
        if self._watcher:
            self._watcher.cancel()
        for handle in self._deadlines.values():
            handle.cancel()
        if self._executor:
            if self.store:
                self._executor.submit(self.store.close)
            self._executor.shutdown(wait=True)

    async def _watch(self) -> None:
        """Once a second: follow receipts other processes changed, and reload changed rules."""
        since = iso(utcnow())
        while True:
            await asyncio.sleep(1)
            since = self._follow_receipts(since)
            if ctx.options.receipts_watch_rules:
                self._reload_rules()

    def _follow_receipts(self, since: str) -> str:
        """Keep flows shown in mitmweb in step with receipts changed elsewhere (the CLI, another proxy)."""
        reader = self._reader()
        if ctx.master.addons.get("view") is None or reader is None:
            return since
        try:
            changed = reader.changed_since(since)
        except (ReceiptsError, sqlite3.Error) as e:
            logger.debug(f"receipt-proxy: could not follow receipts: {e}")
            return since
        for receipt in changed:
            self._refresh_flow(receipt)
        return changed[-1].updated_at if changed else since

    def _reload_rules(self) -> None:
        path = ctx.options.receipts_rules
        sig = rules_signature(path)
        if sig == self._rules_sig:
            return
        self._rules_sig = sig
        try:
            self.rules = load_rules_path(path)
        except RulesError as e:
            logger.error(f"receipt-proxy: rules NOT reloaded, keeping the last good rules: {e}")
        except Exception as e:  # the watcher must outlive any surprise
            logger.exception(f"receipt-proxy: rules NOT reloaded, keeping the last good rules: {type(e).__name__}: {e}")
        else:
            logger.warning(f"receipt-proxy: rules reloaded from {path}: {len(self.rules.operations)} operations")
            self._sync_allow_hosts()

    # --- hooks -----------------------------------------------------------------------------

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        _ack_now(flow)
        if self.rules is None or self.config_error:
            # Not configured (yet): we cannot tell writes from reads, so nothing passes.
            flow.metadata[META] = {"api": "*", "operation": "*", "params": {}}
            return
        req = flow.request
        m = self.rules.match(req.host, req.port, req.method, req.path)
        if m is None:
            return
        req.stream = False  # the receipt must be committed before any byte leaves
        flow.metadata[META] = {"api": m.operation.api, "operation": m.operation.name, "params": m.params}
        if m.pending:
            flow.metadata[META]["pending"] = True  # a GraphQL rule: the body decides (request hook)

    async def request(self, flow: http.HTTPFlow) -> None:
        meta = flow.metadata.get(META)
        if meta is None or flow.response or flow.error or not flow.live:
            return
        if meta.pop("pending", False) and self.rules is not None and not self.config_error:
            req = flow.request
            m = self.rules.match(req.host, req.port, req.method, req.path, body=req.raw_content or b"")
            if m is None:  # a GraphQL query, or a mutation no rule names: passed through untouched
                del flow.metadata[META]
                return
            meta.update(api=m.operation.api, operation=m.operation.name, params=m.params, graphql_args=m.graphql_args)
        try:
            await self._begin(flow, meta)
        except Exception as e:  # fail closed: whatever broke, the request is not forwarded
            logger.exception("receipt-proxy: internal error before forwarding")
            await self._not_forwarded(flow, meta, f"internal error: {type(e).__name__}: {e}")

    async def _begin(self, flow: http.HTTPFlow, meta: dict) -> None:
        if self.config_error or self.store is None or self.rules is None:
            self._answer_unavailable(flow, meta, self.config_error or "receipt-proxy is not configured")
            return
        m = self._rematch(flow, meta)
        if m is None:
            return
        view = RequestView(
            method=flow.request.method, scheme=flow.request.scheme, host=flow.request.host,
            port=flow.request.port, path=flow.request.path,
            headers={k.lower(): v for k, v in flow.request.headers.items()},
            body=flow.request.raw_content or b"",
        )
        store, key, instance = self.store, self.key, self.instance
        replay_window = ctx.options.receipts_replay_window
        op = m.operation
        assert key is not None
        agent_key_header = (op.idempotency_header or "Idempotency-Key").lower()

        wait_submitted = ctx.options.receipts_wait_submitted

        def follows_up(d: Decision) -> bool:
            """A duplicate that first waits for the original's outcome, or reconciles it."""
            state = d.receipt.state
            return d.kind == "blocked" and (
                (state is State.SUBMITTED and wait_submitted > 0)
                or (state is State.OUTCOME_UNKNOWN and _reconcilable_now(op, d.receipt))
            )

        attempts: list[Attempt] = []  # fingerprinted once, in the store's thread

        def decide(final: bool) -> Decision:
            if not attempts:
                intent = fingerprint(m, view, key)
                agent_key = view.headers.get(agent_key_header)
                given_key, idempotency = None, op.idempotency_header is not None
                if op.idempotency_body:
                    # An id the API deduplicates by, in the body: the agent's own, or ours if there is room.
                    given_key, idempotency = identity.body_key(op, view.body, m.graphql_args)
                    if not idempotency:
                        logger.warning(f"{op.api} {op.name}: no place for {op.idempotency_body} in this body; "
                                       "sent without a proxy-chosen id")
                attempts.append(Attempt(
                    api=op.api, operation=op.name, method=view.method,
                    target=intent.target, intent_fingerprint=intent.fingerprint, intent=intent.intent,
                    principal=intent.principal, flow_id=flow.id, instance=instance,
                    client_key=keyed_hash(key, intent.principal, agent_key) if agent_key else None,
                    idempotency=idempotency, approval=op.approve, key_format=op.idempotency_format,
                    given_key=given_key,
                ))
            # Only the answer a duplicate finally gets is recorded.
            return store.begin_attempt(attempts[0], after_success=op.after_success, replay_window=replay_window,
                                       record_duplicate=True if final else (lambda d: not follows_up(d)))

        loop = asyncio.get_running_loop()
        try:
            decision = await loop.run_in_executor(self._executor, decide, False)
            if follows_up(decision):
                receipt = decision.receipt
                if receipt.state is State.SUBMITTED:
                    await self._wait_for_outcome(receipt.operation_id, wait_submitted)
                    receipt = await loop.run_in_executor(self._executor, store.get, receipt.operation_id)
                if receipt.state is State.OUTCOME_UNKNOWN and _reconcilable_now(op, receipt):
                    await self._reconcile_inline(op, receipt, credentials_from(op, view.headers))
                decision = await loop.run_in_executor(self._executor, decide, True)
        except StoreError as e:
            self._answer_unavailable(flow, meta, str(e))
            return
        receipt = decision.receipt
        meta.update(operation_id=receipt.operation_id, state=str(receipt.state), answer=decision.kind)
        if decision.kind == "forward":
            meta["retry_of"] = receipt.retry_of
            if receipt.state is State.AWAITING_APPROVAL:
                receipt = await self._await_approval(flow, meta, receipt)
                if receipt.state is not State.SUBMITTED:
                    return
            self._outcomes[receipt.operation_id] = asyncio.Event()
            if op.idempotency_header and receipt.idempotency_key and agent_key_header not in view.headers:
                flow.request.headers[op.idempotency_header] = receipt.idempotency_key
            if op.idempotency_body and receipt.idempotency_key and attempts[0].given_key is None:
                body = identity.with_body_key(op, view.body, receipt.idempotency_key)
                if body is not None:
                    flow.request.content = body
            self._mark(flow, receipt.state, receipt)
            await self._debug_pause("after_commit", receipt.operation_id)
            if self._client is not None:
                await self._exchange(flow, meta)
            else:
                self._arm_deadline(flow)
        elif decision.kind == "replay":
            self._answer_replay(flow, receipt)
        else:
            self._answer_blocked(flow, receipt, decision.kind, op)

    async def _await_approval(self, flow: http.HTTPFlow, meta: dict, receipt: Receipt) -> Receipt:
        """
        Hold the request with mitmproxy's own intercept until an operator resumes it (approve:
        the receipt becomes submitted and the request is sent) or kills it (deny: rejected,
        "denied by operator"), or until receipts_approval_timeout passes (denied too). The
        agent gets a 403 that says so when denied. The wait holds no thread.
        """
        loop, store = asyncio.get_running_loop(), self.store
        assert store is not None
        flow.intercept()
        self._mark(flow, State.AWAITING_APPROVAL, receipt, prefix="AWAITING APPROVAL (resume to send, kill to deny): ")
        ctx.master.addons.trigger(hooks.UpdateHook([flow]))
        logger.warning(f"receipt {receipt.operation_id} {receipt.api} {receipt.operation}: awaiting approval in mitmweb")
        deadline = loop.time() + ctx.options.receipts_approval_timeout
        killed = lambda: flow.error is not None and flow.error.msg == Error.KILLED_MESSAGE  # noqa: E731
        while flow.intercepted and not killed() and loop.time() < deadline:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(flow.wait_for_resume(), 0.25)
        if not flow.intercepted and not killed():
            to, reason = State.SUBMITTED, "approved by operator"
        elif killed():
            to, reason = State.REJECTED, "denied by operator"
        else:
            to, reason = State.REJECTED, f"denied: no decision within receipts_approval_timeout ({ctx.options.receipts_approval_timeout}s)"
        receipt = await loop.run_in_executor(self._executor, lambda: store.transition(
            receipt.operation_id, to, reason=reason, actor="mitmweb operator" if "operator" in reason else "proxy",
            expect=[State.AWAITING_APPROVAL], flow_id=flow.id, **({} if to is State.SUBMITTED else {"error": reason})))
        meta["state"] = str(receipt.state)
        self._mark(flow, receipt.state, receipt)
        if to is not State.SUBMITTED:
            meta["outcome"], meta["answer"] = str(to), "denied"
            # Answer the agent even when the flow was killed: undo the kill, send a 403 that says why.
            flow.error, flow.live, flow.intercepted = None, True, False
            flow.response = answers.denied(receipt, reason)
            logger.warning(f"receipt {receipt.operation_id}: {reason}")
        return receipt

    # --- commands (mitmproxy's command prompt; mitmweb users reach them through the console) ---

    def _flow_receipt(self, f: mflow.Flow) -> tuple[dict, Receipt]:
        meta = web._meta(f)
        reader = self._reader()
        if meta is None or reader is None:
            raise exceptions.CommandError("this flow has no receipt")
        return meta, reader.get(meta["operation_id"])

    @command.command("receipts.show")
    def show(self, f: mflow.Flow) -> str:
        """The receipt behind a flow, with its history: receipts.show @focus"""
        meta, receipt = self._flow_receipt(f)
        return web.describe(self._reader(), receipt.operation_id, answer=meta.get("answer"))  # type: ignore[arg-type]

    @command.command("receipts.reconcile")
    def reconcile_flow(self, f: mflow.Flow) -> str:
        """Look for the effect of a flow's unknown outcome with a read, using that flow's credentials: receipts.reconcile @focus"""
        meta, receipt = self._flow_receipt(f)
        op = self._operation(meta)
        if receipt.state not in (State.OUTCOME_UNKNOWN, State.MANUAL_REVIEW):
            raise exceptions.CommandError(f"receipt {receipt.operation_id} is {receipt.state}; "
                                          "only outcome_unknown and manual_review receipts are reconciled")
        if op is None:
            raise exceptions.CommandError(f"the rules no longer have {receipt.api} {receipt.operation}")
        credentials = credentials_from(op, {k.lower(): v for k, v in f.request.headers.items()})  # type: ignore[attr-defined]
        asyncio.get_running_loop().create_task(self._reconcile_inline(op, receipt, credentials, from_command=True))
        return f"reconciling receipt {receipt.operation_id}; its flow's comment shows the result"

    @command.command("receipts.resolve")
    def resolve_flow(self, f: mflow.Flow, state: str, note: str) -> str:
        """Settle a flow's receipt by hand: receipts.resolve @focus succeeded|safe_to_retry|rejected "why" """
        _, receipt = self._flow_receipt(f)
        if state not in {s.value for s in RESOLUTIONS}:
            raise exceptions.CommandError(f"resolve as one of {', '.join(RESOLUTIONS)}, not {state!r}")
        store = self.store
        assert store is not None and self._executor is not None
        try:
            done = self._executor.submit(store.resolve, receipt.operation_id, State(state), note=note,
                                         actor="mitmweb operator").result(timeout=ctx.options.receipts_lock_timeout + 1)
        except (ReceiptsError, ValueError) as e:
            raise exceptions.CommandError(str(e)) from None
        self._refresh_flow(done)
        return f"receipt {done.operation_id} is now {done.state}"

    def _refresh_flow(self, receipt: Receipt) -> None:
        """Keep the original flow's comment and marker in step with its receipt while mitmweb shows it."""
        view = ctx.master.addons.get("view")
        f = view.get_by_id(receipt.flow_id) if view is not None and receipt.flow_id else None
        if f is None:
            return
        if META in f.metadata:
            f.metadata[META]["state"] = str(receipt.state)
        self._mark(f, receipt.state, receipt)
        ctx.master.addons.trigger(hooks.UpdateHook([f]))

    async def _debug_pause(self, point: str, operation_id: str) -> None:
        name, _, seconds = ctx.options.receipts_debug_pause.partition(":")
        if name == point:
            logger.warning(f"receipt {operation_id}: pausing at {point} for {seconds}s (receipts_debug_pause)")
            await asyncio.sleep(float(seconds or 0))

    async def _wait_for_outcome(self, operation_id: str, timeout: float) -> None:
        """
        Wait, without holding a thread, until a submitted receipt has an outcome or `timeout`
        passes: on this process's own event, or by polling the store when another proxy
        process sent the original.
        """
        loop = asyncio.get_running_loop()
        event = self._outcomes.get(operation_id)
        if event is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout)
            return
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            await asyncio.sleep(min(0.2, max(0.0, deadline - loop.time())))
            receipt = await loop.run_in_executor(self._executor, self.store.get, operation_id)  # type: ignore[union-attr]
            if receipt.state is not State.SUBMITTED:
                return

    async def _exchange(self, flow: http.HTTPFlow, meta: dict) -> None:
        """Send the request ourselves: the exchange outlives an agent that hangs up (see exchange.py)."""
        assert self._client is not None
        result = await exchange.send(self._client, flow.request, deadline=ctx.options.receipts_upstream_timeout)
        if isinstance(result, exchange.Failure):
            meta["outcome"] = str(result.state)
            await self._record(flow, meta, result.state, result.message, {"error": result.message})
            flow.response = answers.exchange_failed(meta["operation_id"], result.state, result.message,
                                                    timed_out=result.timed_out)
            return
        flow.response = result
        await self._debug_pause("after_answer", meta["operation_id"])
        await self._record_response(flow, meta)

    async def _reconcile_inline(self, op: Operation, receipt: Receipt, credentials: dict[str, str],
                                from_command: bool = False, evidence: bool = False) -> None:
        """
        Resolve an outcome_unknown receipt while its duplicate waits, with the duplicate's own
        credentials (nothing is stored). Concurrent duplicates in this process share one read;
        in other processes, the store's guarded claim lets only one of them read.
        """
        running = self._reconciles.get(receipt.operation_id)
        if running is not None:
            await asyncio.shield(running)
            return
        task = asyncio.get_running_loop().create_task(self._run_reconcile(op, receipt, credentials, from_command, evidence))
        self._reconciles[receipt.operation_id] = task
        try:
            await asyncio.shield(task)
        finally:
            self._reconciles.pop(receipt.operation_id, None)

    async def _run_reconcile(self, op: Operation, receipt: Receipt, credentials: dict[str, str],
                             from_command: bool = False, evidence: bool = False) -> None:
        """`evidence`: the API answered that the effect may already exist; only a read decides,
        even where resending with the same idempotency key would otherwise be safe."""
        loop, store = asyncio.get_running_loop(), self.store
        actor = "mitmweb operator (receipts.reconcile)" if from_command else "proxy (inline reconcile)"
        assert store is not None
        try:
            claimed = await loop.run_in_executor(self._executor, lambda: store.claim_for_reconcile(
                receipt.operation_id, actor=actor,
                reason="the answer says it may already exist: reconciling with a read" if evidence else
                "an operator asked for a read" if from_command else "a duplicate arrived: reconciling with a read"))
        except IllegalTransition:
            return  # another proxy process claimed it first
        try:
            if key_dedupes(op, claimed, store.clock()) and not evidence:
                verdict = Verdict(State.SAFE_TO_RETRY, f"the API deduplicates by {op.idempotency_header}; "
                                                       f"sending again with the same key {claimed.idempotency_key} is safe")
            elif op.reconcile is None:
                verdict = Verdict(State.MANUAL_REVIEW, f"the API forgets {op.idempotency_header} keys after "
                                                       f"{op.idempotency_ttl}s and no read is configured")
            else:
                read = plan_read(op, claimed)
                opts = ctx.options
                verify: Any = False if opts.ssl_insecure else (opts.ssl_verify_upstream_trusted_ca or True)
                rules = self.rules
                post_reads = rules.post_reads(op.api) if rules else ()
                try:
                    status, headers, body = await perform_read_async(
                        read, credentials, timeout=opts.receipts_read_timeout, verify=verify, post_reads=post_reads)
                except httpx.HTTPError as e:
                    verdict = Verdict(State.MANUAL_REVIEW, f"read {read.method} {read.shown} failed: {describe(e)}")
                else:
                    verdict = judge(op.reconcile, read, claimed, status, body, headers=headers, now=store.clock())
        except Exception as e:  # never leave a receipt in reconciling
            logger.exception(f"receipt {claimed.operation_id}: reconcile failed")
            verdict = Verdict(State.MANUAL_REVIEW, f"reconcile failed: {type(e).__name__}: {e}")
        done = await loop.run_in_executor(self._executor, lambda: finish(store, claimed, verdict, actor=actor))
        logger.warning(f"receipt {done.operation_id} {done.api} {done.operation}: {done.state} ({verdict.reason})")
        self._refresh_flow(done)

    async def response(self, flow: http.HTTPFlow) -> None:
        meta = self._awaiting_outcome(flow)
        if meta is not None:
            await self._record_response(flow, meta)

    async def _record_response(self, flow: http.HTTPFlow, meta: dict) -> None:
        resp = flow.response
        assert resp is not None
        op = self._operation(meta)
        recorded, body = answers.recorded(resp, ctx.options.receipts_response_cap)
        headers = {k.lower(): v for k, v in resp.headers.items()}
        verdict, why = classify_response(resp.status_code, headers, body, op)
        exists = verdict == ALREADY_EXISTS
        state = State.OUTCOME_UNKNOWN if exists else State(verdict)
        fields: dict[str, Any] = {"http_status": resp.status_code, "response": recorded}
        if state is State.SUCCEEDED:
            fields["external_id"] = response_external_id(op, headers, body)
        else:
            fields["error"] = f"HTTP {resp.status_code} {resp.reason}".strip() + (f": {why}" if why else "")
        reason = f"upstream answered HTTP {resp.status_code}" + (f": {why}" if why else "")
        if exists:
            reason += " (evidence that the effect may already exist: a read decides)"
        meta["outcome"] = str(state)
        receipt = await self._record(flow, meta, state, reason, fields)
        if exists and op is not None and receipt is not None:
            # Evidence, not a rejection: look it up now, with this request's own credentials.
            await self._reconcile_inline(op, receipt, credentials_from(op, {k.lower(): v for k, v in flow.request.headers.items()}),
                                         evidence=True)
            receipt = await asyncio.get_running_loop().run_in_executor(self._executor, self.store.get, meta["operation_id"])  # type: ignore[union-attr]
            meta["state"] = str(receipt.state)
            self._mark(flow, receipt.state, receipt)
            if receipt.external_id:
                resp.headers["X-Receipt-External-Id"] = receipt.external_id
        resp.headers["X-Receipt-Id"] = meta["operation_id"]
        resp.headers["X-Receipt-State"] = meta["state"]

    async def error(self, flow: http.HTTPFlow) -> None:
        meta = self._awaiting_outcome(flow)
        if meta is None:
            return
        sc = flow.server_conn
        message = flow.error.msg if flow.error else "unknown error"
        if meta.get("deadline_passed"):
            message = f"no answer within receipts_upstream_timeout ({message})"
        state, reason = classify_error(
            message, tcp_setup=sc.timestamp_tcp_setup, tls=flow.request.scheme == "https",
            tls_setup=sc.timestamp_tls_setup,
        )
        meta["outcome"] = str(state)
        await self._record(flow, meta, state, reason, {"error": message})

    # --- helpers ---------------------------------------------------------------------------

    def _awaiting_outcome(self, flow: http.HTTPFlow) -> dict | None:
        """The flow's receipt metadata if we forwarded it and have not recorded its outcome yet."""
        meta = flow.metadata.get(META)
        if meta is None or meta.get("answer") != "forward" or "outcome" in meta:
            return None
        self._disarm_deadline(flow)
        return meta

    def _rematch(self, flow: http.HTTPFlow, meta: dict) -> Match | None:
        """The match found in requestheaders, against the rules in force now."""
        op = self._operation(meta)
        if op is None:  # the rules were reloaded in between and the operation is gone
            flow.metadata.pop(META, None)
            return None
        return Match(op, dict(meta["params"]), graphql_args=meta.get("graphql_args"))

    def _operation(self, meta: dict) -> Operation | None:
        return self.rules.operation(meta["api"], meta["operation"]) if self.rules else None

    async def _record(self, flow: http.HTTPFlow, meta: dict, state: State, reason: str, fields: dict) -> Receipt | None:
        """Record a forwarded request's outcome; the receipt, or None when the store refused it."""
        try:
            return await self._record_outcome(flow, meta, state, reason, fields)
        finally:
            if (event := self._outcomes.pop(meta["operation_id"], None)) is not None:
                event.set()  # duplicates waiting for this outcome decide again

    async def _record_outcome(self, flow: http.HTTPFlow, meta: dict, state: State, reason: str, fields: dict) -> Receipt | None:
        store = self.store
        assert store is not None
        try:
            receipt = await asyncio.get_running_loop().run_in_executor(
                self._executor,
                lambda: store.transition(meta["operation_id"], state, reason=reason, expect=[State.SUBMITTED],
                                         flow_id=flow.id, **fields),
            )
        except StoreError as e:
            logger.error(
                f"receipt {meta['operation_id']}: could not record {state} ({reason}): {e}; "
                "it stays submitted and becomes outcome_unknown when the proxy restarts"
            )
            flow.comment = f"receipt {meta['operation_id']}: NOT RECORDED as {state}: {e}"
            return None
        meta["state"] = str(receipt.state)
        self._mark(flow, receipt.state, receipt)
        level = logging.INFO if receipt.state is State.SUCCEEDED else logging.WARNING
        logger.log(level, f"receipt {receipt.operation_id} {receipt.api} {receipt.operation} "
                          f"{receipt.method} {receipt.target}: {receipt.state} ({reason})")
        return receipt

    def _mark(self, flow: http.HTTPFlow, marker_key: Any, receipt: Receipt, prefix: str = "") -> None:
        flow.marked = answers.MARKERS[marker_key]
        flow.comment = answers.comment(receipt, prefix)

    def _arm_deadline(self, flow: http.HTTPFlow) -> None:
        loop = asyncio.get_running_loop()
        self._deadlines[flow.id] = loop.call_later(ctx.options.receipts_upstream_timeout, self._deadline_passed, flow)

    def _disarm_deadline(self, flow: http.HTTPFlow) -> None:
        handle = self._deadlines.pop(flow.id, None)
        if handle:
            handle.cancel()

    def _deadline_passed(self, flow: http.HTTPFlow) -> None:
        self._deadlines.pop(flow.id, None)
        if flow.response or flow.error:
            return
        flow.metadata[META]["deadline_passed"] = True
        logger.warning(f"receipt {flow.metadata[META].get('operation_id')}: no answer within "
                       f"{ctx.options.receipts_upstream_timeout}s; ending the upstream exchange")
        _close_server_connection(flow)

    def _answer_blocked(self, flow: http.HTTPFlow, receipt: Receipt, kind: str, op: Operation | None = None) -> None:
        flow.response = answers.duplicate(receipt, kind, retry_after=retry_after(op, receipt, utcnow()))
        prefix = "BLOCKED reused Idempotency-Key of " if kind == "key_conflict" else "BLOCKED duplicate of "
        self._mark(flow, "blocked", receipt, prefix=prefix)
        logger.warning(f"receipt {receipt.operation_id}: duplicate blocked ({receipt.state})")

    def _answer_replay(self, flow: http.HTTPFlow, receipt: Receipt) -> None:
        flow.response = answers.replay(receipt)
        self._mark(flow, "replayed", receipt, prefix="REPLAYED from ")
        logger.info(f"receipt {receipt.operation_id}: duplicate answered with the recorded response")

    async def _not_forwarded(self, flow: http.HTTPFlow, meta: dict, why: str) -> None:
        """Answer 503 and, if a receipt was already committed, record that it was not sent."""
        if meta.get("answer") == "forward" and "outcome" not in meta:
            meta["outcome"] = str(State.NOT_SENT)
            await self._record(flow, meta, State.NOT_SENT, f"not sent: {why}", {"error": why})
        self._answer_unavailable(flow, meta, why)

    def _answer_unavailable(self, flow: http.HTTPFlow, meta: dict, why: str) -> None:
        logger.error(f"receipt-proxy: {meta['api']} {meta['operation']} NOT forwarded, no receipt could be written: {why}")
        flow.response = answers.unavailable(meta["api"], meta["operation"], why)
        meta["answer"] = "store_unavailable"
        flow.marked = answers.MARKERS["store_unavailable"]
        flow.comment = f"NOT SENT: no receipt could be written ({why})"


# --- process-level helpers ---------------------------------------------------------------------


def _reconcilable_now(op: Operation, receipt: Receipt) -> bool:
    """
    Whether a duplicate should reconcile an outcome_unknown receipt now: the API deduplicates
    by its key, or a read is configured, and a read that cannot prove absence yet (settle)
    has not looked since the outcome became unknown (then it waits until it can).
    """
    now = utcnow()
    if key_dedupes(op, receipt, now):
        return True
    if op.reconcile is None:
        return False
    return retry_after(op, receipt, now) is None or receipt.updated_at == receipt.completed_at


def _check_deferred_options(loader: Loader) -> None:
    """
    mitmproxy silently drops a script addon whose deferred `--set` value fails type
    parsing, and then serves traffic unrecorded. Parse our values here and log an
    error instead, which stops mitmproxy at startup.
    """
    options = loader.master.options
    ours = {name: typespec for name, typespec, _, _ in OPTIONS}
    for name in list(options.deferred):
        if name.startswith("receipts_") and name not in ours:
            logger.error(f"unknown option {name}; receipt-proxy knows: {', '.join(ours)}")
            del options.deferred[name]
            continue
        if name not in ours:
            continue
        raw = options.deferred[name]
        if not hasattr(raw, "val"):  # already a typed value, not a --set string
            continue
        try:
            options._parse_setval(options._options[name], raw.val)
        except exceptions.OptionsError as e:
            logger.error(f"receipt-proxy: bad value for {name}: {e}")
            del options.deferred[name]


_QUICKACK = getattr(socket, "TCP_QUICKACK", None)  # Linux only


def _ack_now(flow: http.HTTPFlow) -> None:
    """
    ACK a request's headers at once, so that a client with Nagle's algorithm on sends the body now.

    urllib3 (so requests, and the SDKs built on it) leaves Nagle's algorithm on for
    connections to a proxy, and http.client writes a request's headers and its body in two
    send() calls: the body then waits in the client's kernel until the proxy ACKs the
    headers, and Linux delays that ACK by ~40 ms on a keep-alive connection, since the
    proxy has nothing to send back until it has the body. See docs/benchmarks.md.
    """
    headers = flow.request.headers
    if _QUICKACK is None or (headers.get("content-length", "0").strip() in ("", "0") and "transfer-encoding" not in headers):
        return
    io = _transport(flow, flow.client_conn)
    get_extra_info = getattr(getattr(io, "writer", None), "get_extra_info", None)  # mitmproxy_rs streams have no socket
    sock = get_extra_info("socket") if get_extra_info else None
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)


def _transport(flow: http.HTTPFlow, conn: Any) -> Any:
    """mitmproxy's transport for one side of a live flow, or None. Internals: no public API has it."""
    handler = getattr(ctx.master.addons.get("proxyserver"), "connections", {}).get(flow.client_conn.id)
    return getattr(handler, "transports", {}).get(conn) if handler else None


def _close_server_connection(flow: http.HTTPFlow) -> None:
    """End a flow's upstream exchange. mitmproxy 12 has no public call for this (flow.kill() cannot stop a flow in transit)."""
    transport = _transport(flow, flow.server_conn)
    if transport is None or transport.handler is None:
        logger.error(f"receipt-proxy: could not end the upstream exchange of flow {flow.id}")
        return
    transport.handler.cancel("receipt-proxy: upstream deadline passed")


addons = [Receipts()]
