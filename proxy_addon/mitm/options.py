"""
The addon's options, declared for mitmproxy and parsed by pure functions.

Every knob is a `receipts_*` option with help that shows its syntax. Values are checked in
`check()` (called from `configure()`), which raises OptionsError naming the option and the
value, so a bad `--set` stops the proxy at startup with one line.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, NamedTuple

from mitmproxy import exceptions
from mitmproxy.addonmanager import Loader

from proxy_addon.gate.admission import GateSettings
from proxy_addon.gate.otel_setup import check_endpoint
from proxy_addon.gate.paths import DEFAULT_DB, DEFAULT_RULES
from proxy_addon.reconcile.http_reads import ReadSettings
from proxy_addon.reconcile.judge import UPSTREAM_TIMEOUT
from proxy_addon.wire.upstream import Upstream

logger = logging.getLogger(__name__)

FORWARD_CHOICES = ("addon", "mitmproxy")
MODE_CHOICES = ("enforce", "observe")
LOG_FORMATS = ("text", "json")
PAUSE_POINTS = ("after_commit", "after_answer")


class Option(NamedTuple):
    name: str
    typespec: type
    default: Any
    help: str
    choices: Sequence[str] | None = None


OPTIONS: list[Option] = [
    Option(
        "receipts_db",
        str,
        DEFAULT_DB,
        "Path of the SQLite receipts database (created with mode 0600), "
        "e.g. --set receipts_db=~/.local/state/receipt-proxy/receipts.db; or a PostgreSQL database shared by a "
        "fleet of proxies: a postgresql:// URL or libpq conninfo (PG* variables fill the rest; keep the password "
        "in PGPASSWORD or ~/.pgpass), e.g. --set receipts_db=postgresql://proxy@db.internal/receipts",
    ),
    Option(
        "receipts_rules",
        str,
        DEFAULT_RULES,
        "A rules file, or a folder whose *.yaml files are loaded, e.g. --set receipts_rules=./rules",
    ),
    Option(
        "receipts_new_db",
        bool,
        False,
        "Create a new, empty receipts database even though a secret.key or instances folder beside receipts_db "
        "shows that one existed there (it was removed or moved); without it the proxy refuses to start",
    ),
    Option(
        "receipts_secret",
        str,
        "",
        "Path of the per-installation HMAC key that hashes credentials into the principal; "
        "created on first run with mode 0600. Default: secret.key beside receipts_db (with a PostgreSQL "
        "receipts_db: in $RECEIPT_PROXY_STATE_DIR, else ~/.local/state/receipt-proxy); every proxy of a fleet "
        "needs the same key",
    ),
    Option(
        "receipts_replay_window",
        int,
        86400,
        "Seconds after success during which a duplicate gets the recorded response (after_success: replay), "
        "e.g. --set receipts_replay_window=3600",
    ),
    Option(
        "receipts_upstream_timeout",
        int,
        UPSTREAM_TIMEOUT,
        "Seconds to wait for the upstream's answer to a matched request; "
        "past that the exchange is ended and the receipt is outcome_unknown",
    ),
    Option(
        "receipts_lock_timeout",
        int,
        5,
        "Seconds to wait for a locked receipts database before answering 503 (not sent)",
    ),
    Option(
        "receipts_lease",
        int,
        15,
        "PostgreSQL: seconds a proxy instance counts as alive after its last heartbeat; then any live instance "
        "moves its in-flight receipts to outcome_unknown (never retried). Longer than receipts_heartbeat",
    ),
    Option(
        "receipts_heartbeat",
        int,
        5,
        "PostgreSQL: seconds between two heartbeats renewing this instance's lease (and recovering the receipts "
        "of instances whose lease expired)",
    ),
    Option(
        "receipts_checkpoint_events",
        int,
        1000,
        "Sign a checkpoint of the receipts' hash chain (docs/proof.md) once it grew by this many records; "
        "with checkpoint.key, an Ed25519 key made beside secret.key",
    ),
    Option(
        "receipts_checkpoint_seconds",
        int,
        60,
        "Sign a checkpoint of the receipts' hash chain at least this often (seconds) while it grows; and once "
        "more when the proxy stops",
    ),
    Option(
        "receipts_response_cap",
        int,
        1048576,
        "Largest response body (bytes) recorded for replay and read to classify the answer; past it the outcome is "
        "recorded from the status at once, and a success is blocked instead of replayed",
    ),
    Option(
        "receipts_response_max",
        int,
        64 * 1024 * 1024,
        "Largest response body (bytes) to a matched write that the proxy holds to pass to the agent; past it the "
        "exchange is ended and the agent gets 502 response_too_large (the outcome is recorded from the status), "
        "e.g. --set receipts_response_max=268435456",
    ),
    Option(
        "receipts_body_cap",
        int,
        100 * 1024 * 1024,
        "Largest request body (bytes) of a matched write, as sent and once its Content-Encoding is decoded; a larger "
        "one is answered 413 and not sent (nor recorded), e.g. --set receipts_body_cap=268435456",
    ),
    Option(
        "receipts_read_timeout",
        int,
        30,
        "Seconds a reconcile read (GET/HEAD) may take; past that it is a failed read (see receipts_read_attempts)",
    ),
    Option(
        "receipts_read_attempts",
        int,
        3,
        "Failed reconcile reads (timeout, TLS error, 429, 5xx, an answer that cannot be judged) after which a "
        "receipt goes to manual_review; until then it stays outcome_unknown and waits for its next read",
    ),
    Option(
        "receipts_read_deadline",
        int,
        86400,
        "Seconds after an outcome became unknown past which a failed reconcile read sends the receipt to "
        "manual_review, however few reads failed",
    ),
    Option(
        "receipts_read_backoff",
        int,
        30,
        "Seconds before the next reconcile read after a failed one, doubling after each (at most an hour); "
        "a Retry-After in the failed read's answer is used instead. Duplicates meanwhile get 409 with Retry-After",
    ),
    Option(
        "receipts_reads_max",
        int,
        8,
        "Reconcile reads the proxy runs at once; the others wait their turn, each at most receipts_read_timeout "
        "(then it is not read, nothing is recorded and its duplicates get 409), e.g. --set receipts_reads_max=4",
    ),
    Option(
        "receipts_wait_submitted",
        int,
        30,
        "Seconds a duplicate of a request still in flight waits for its outcome "
        "(then gets the replay, or the 409); 0: answer 409 at once",
    ),
    Option(
        "receipts_mcp_rounds",
        int,
        10,
        "Times an MCP tool call's server may ask for input (input_required) and get the client's next round "
        "under the call's receipt; past that, the next round is not sent and the receipt becomes outcome_unknown",
    ),
    Option(
        "receipts_mcp_input_wait",
        int,
        600,
        "Seconds an MCP tool call whose server asked for input (input_required) waits for the client's next "
        "round; past that, an identical call finds it outcome_unknown (its client is taken as gone)",
    ),
    Option(
        "receipts_mode",
        str,
        "enforce",
        "'enforce': duplicates are blocked or replayed, approvals hold, deny decisions refuse. 'observe' (shadow "
        "mode): every receipt and decision is recorded the same, but each write is sent; its events say what "
        "enforcement would have done (would_block, would_replay, would_hold, would_deny): `receipts report`",
        MODE_CHOICES,
    ),
    Option(
        "receipts_forward",
        str,
        "addon",
        "Who sends matched requests upstream: 'addon' (the exchange survives an agent that hangs up, "
        "so the real outcome is recorded) or 'mitmproxy' (mitmproxy's own forwarding; "
        "an agent that hangs up leaves outcome_unknown)",
        FORWARD_CHOICES,
    ),
    Option(
        "receipts_debug_pause",
        str,
        "",
        "For crash tests only: pause a matched request at a point, e.g. after_commit:10 (the receipt is committed, "
        "nothing sent) or after_answer:10 (the upstream answered, the receipt not yet updated)",
    ),
    Option(
        "receipts_intercept_all",
        bool,
        False,
        "Intercept TLS to every host; by default only the hosts named in the rules are intercepted and every other "
        "host is tunnelled untouched (mitmproxy's allow_hosts, derived from the rules)",
    ),
    Option(
        "receipts_approval_timeout",
        int,
        300,
        "Seconds a write of an operation with approve: true waits for an operator to resume (approve) or kill "
        "(deny) it in mitmweb, to run receipts approve/deny, or to follow an approval link; past that it is denied "
        "(rejected, never sent), and its links expire",
    ),
    Option(
        "receipts_approval_webhook",
        str,
        "",
        "A URL to POST a signed JSON notice to when a write is held for approval (its receipt, the intent's named "
        "fields, approve and deny links, a Slack-compatible text: a Slack incoming-webhook URL works as it is), "
        "e.g. --set receipts_approval_webhook=https://hooks.slack.com/services/...; needs "
        "receipts_approval_webhook_secret or $RECEIPT_PROXY_WEBHOOK_SECRET. Empty: off",
    ),
    Option(
        "receipts_approval_webhook_secret",
        str,
        "",
        "Path of a file holding the key that signs the approval webhook's body (HMAC-SHA256, header "
        "X-Receipt-Signature: docs/operations.md); empty: the value of $RECEIPT_PROXY_WEBHOOK_SECRET",
    ),
    Option(
        "receipts_approval_listen",
        str,
        "",
        "Serve the approval links (GET shows the held write, POST decides) at http://HOST:PORT/approvals/..., "
        "e.g. --set receipts_approval_listen=127.0.0.1:9465 (port 0: any free port, logged); empty: off. "
        "Keep it on a loopback or private address; every proxy of a fleet can serve any proxy's links",
    ),
    Option(
        "receipts_approval_url",
        str,
        "",
        "The base URL the approval links carry, where a person's browser reaches a proxy's receipts_approval_listen "
        "(e.g. https://approvals.internal); empty: http://HOST:PORT of receipts_approval_listen",
    ),
    Option(
        "receipts_drain_timeout",
        int,
        30,
        "Seconds a SIGTERM or SIGINT waits for the matched requests in flight to end (their outcomes recorded, "
        "their agents answered) before the proxy exits; new matched writes meanwhile get 503 not_sent. "
        "What is still in flight then is recorded outcome_unknown. A second signal exits at once",
    ),
    Option(
        "receipts_watch_rules",
        bool,
        True,
        "Reload the rules when a rules file changes; a bad edit keeps the last good rules and logs an error",
    ),
    Option(
        "receipts_learn",
        str,
        "",
        "Append the shape of every write seen (matched by a rule or not) to this file, one JSON line each, for "
        "`receipts rules draft --flows FILE`: method, host, path (ids as {id}), query names, content type, status, "
        "and body field names with a keyed hash of each value (the key lives in memory only: values compare, none "
        "can be read back); no secret-named field, no header value. E.g. --set receipts_learn=./learn.jsonl; "
        "empty: off",
    ),
    Option(
        "receipts_metrics",
        str,
        "",
        "Serve Prometheus metrics at http://HOST:PORT/metrics, e.g. --set receipts_metrics=127.0.0.1:9464 "
        "(port 0: any free port, logged); empty: off. No credential, receipt id or URL is in them, "
        "but anyone who reaches the port reads them: keep it on a private address",
    ),
    Option(
        "receipts_otel",
        str,
        "",
        "Export an OpenTelemetry span per matched write over OTLP/HTTP to this endpoint, e.g. --set "
        "receipts_otel=http://127.0.0.1:4318 (/v1/traces is added); the OTEL_EXPORTER_OTLP_ENDPOINT or "
        "_TRACES_ENDPOINT variables turn it on too. Needs the otel extra: pip install 'receipt-proxy[otel]'. "
        "Empty, with neither variable set: off (docs/operations.md, OpenTelemetry)",
    ),
    Option(
        "receipts_log_format",
        str,
        "text",
        "'text': the addon's log lines as text. 'json': each line the addon logs is one JSON object (time, level, "
        "event, receipt, api, operation, state, reason, trace_id), with the same redaction",
        LOG_FORMATS,
    ),
]
POSITIVE = (
    "receipts_replay_window",
    "receipts_upstream_timeout",
    "receipts_response_cap",
    "receipts_response_max",
    "receipts_body_cap",
    "receipts_lock_timeout",
    "receipts_read_timeout",
    "receipts_approval_timeout",
    "receipts_drain_timeout",
    "receipts_read_attempts",
    "receipts_read_deadline",
    "receipts_read_backoff",
    "receipts_reads_max",
    "receipts_mcp_rounds",
    "receipts_mcp_input_wait",
    "receipts_lease",
    "receipts_heartbeat",
    "receipts_checkpoint_events",
    "receipts_checkpoint_seconds",
)


def declare(loader: Loader) -> None:
    for o in OPTIONS:
        loader.add_option(o.name, o.typespec, o.default, o.help, choices=o.choices)


def parse_debug_pause(text: str) -> tuple[str, float] | None:
    """`after_commit:10` → ("after_commit", 10.0); "" → None. ValueError names what is wrong."""
    if not text:
        return None
    point, _, seconds = text.partition(":")
    if point not in PAUSE_POINTS or not seconds.isdigit():
        raise ValueError(f"{text!r} is not after_commit:N or after_answer:N")
    return point, float(seconds)


def parse_listen(text: str) -> tuple[str, int] | None:
    """`127.0.0.1:9464` → ("127.0.0.1", 9464), `[::1]:9464` → ("::1", 9464); "" → None. ValueError: what is wrong."""
    text = text.strip()
    if not text:
        return None
    host, sep, port = text.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    if bracketed:
        host = host[1:-1]
    if not sep or not host or "[" in host or "]" in host or (":" in host and not bracketed):
        raise ValueError(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:9464, [::1]:9464), or empty to turn it off")
    if not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{text!r}: the port must be a number from 0 to 65535")
    return host, int(port)


def check(opts: Any) -> None:
    """Refuse values the addon cannot work with: OptionsError naming the option."""
    if getattr(opts, "connection_strategy", "lazy") != "lazy":
        raise exceptions.OptionsError(
            "receipt-proxy needs connection_strategy=lazy, so that every upstream failure reaches a flow"
        )
    for name in POSITIVE:
        if getattr(opts, name) <= 0:
            raise exceptions.OptionsError(f"{name} must be a positive number, not {getattr(opts, name)}")
    if opts.receipts_heartbeat >= opts.receipts_lease:
        raise exceptions.OptionsError(
            f"receipts_heartbeat ({opts.receipts_heartbeat}) must be shorter than receipts_lease "
            f"({opts.receipts_lease}): a lease must outlast the time between two heartbeats"
        )
    if opts.receipts_response_max < opts.receipts_response_cap:
        raise exceptions.OptionsError(
            f"receipts_response_max ({opts.receipts_response_max}) must be at least receipts_response_cap "
            f"({opts.receipts_response_cap}): the proxy reads that much of an answer before it records it"
        )
    try:
        parse_debug_pause(opts.receipts_debug_pause)
    except ValueError as e:
        raise exceptions.OptionsError(f"receipts_debug_pause: {e}") from None
    try:
        check_endpoint(opts.receipts_otel)
    except ValueError as e:
        raise exceptions.OptionsError(f"receipts_otel: {e}") from None
    for name in ("receipts_metrics", "receipts_approval_listen"):
        try:
            parse_listen(getattr(opts, name))
        except ValueError as e:
            raise exceptions.OptionsError(f"{name}: {e}") from None
    if opts.receipts_forward == "addon" and getattr(opts, "client_certs", None):
        raise exceptions.OptionsError(
            "client_certs is set; use --set receipts_forward=mitmproxy to send matched "
            "requests with client certificates"
        )


def upstream_of(opts: Any) -> Upstream:
    """How forwarding and reads reach upstreams, from mitmproxy's own options (absent ones count as unset)."""
    proxy = auth = None
    for mode in getattr(opts, "mode", ()):
        if mode.startswith("upstream:"):
            proxy = mode.split(":", 1)[1].split("@")[0]
            auth = getattr(opts, "upstream_auth", None) or None
    return Upstream(
        insecure=bool(getattr(opts, "ssl_insecure", False)),
        ca_file=getattr(opts, "ssl_verify_upstream_trusted_ca", None) or None,
        ca_dir=getattr(opts, "ssl_verify_upstream_trusted_confdir", None) or None,
        proxy=proxy,
        proxy_auth=auth,
        http2=bool(getattr(opts, "http2", False)),
    )


def gate_settings(opts: Any) -> GateSettings:
    return GateSettings(
        replay_window=opts.receipts_replay_window,
        wait_submitted=opts.receipts_wait_submitted,
        reads_max=opts.receipts_reads_max,
        mcp_input_wait=opts.receipts_mcp_input_wait,
        reads=ReadSettings(
            upstream=upstream_of(opts),
            timeout=opts.receipts_read_timeout,
            attempts=opts.receipts_read_attempts,
            deadline=opts.receipts_read_deadline,
            backoff=opts.receipts_read_backoff,
        ),
    )


def check_deferred(loader: Loader) -> None:
    """
    mitmproxy silently drops a script addon whose deferred `--set` value fails type
    parsing, and then serves traffic unrecorded. Parse our values here and log an
    error instead, which stops mitmproxy at startup.
    """
    options = loader.master.options
    ours = {o.name for o in OPTIONS}
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
