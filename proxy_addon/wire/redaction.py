"""
Secrets: which names carry credentials, how they are redacted, and which header counts.

    is_secret_name("access_token")           # True: never in a fingerprint, the intent or a URL
    redact_url("https", "api.test", 443, "/x?token=s&page=2")   # "https://api.test/x?token=REDACTED&page=REDACTED"
    redact_url("https", "api.test", 443, "/x?token=s&page=2", keep=("page",))   # "...?token=REDACTED&page=2"
    credentials_from(("api-key",), headers)  # the credential headers a request carries, in order
    is_credential_name("client_secret")      # True: counted in the principal by default (intent/caller.py)
    token_shaped("ghp_...")                  # True: the shape of a known token format
    redact_url("https", "api.telegram.org", 443, "/bot123456:AAH.../sendMessage")   # ".../REDACTED/sendMessage"

URLs are redacted by default: a stored or logged URL keeps the value of a query parameter
only when its name is in `keep` (the parameters the rule's fingerprint names, or a read's
template writes) and does not look like a credential. Every other value is REDACTED,
whatever its name (`?jwt=`, `?x_thing=`), and a bare `?value` with no name too.

Path segments are redacted when they carry a credential: a path parameter the caller says
is one (`secrets`: caller.secret_params), a segment with the shape of a known token format
(TOKEN_SHAPES), and the token of a Slack or Discord webhook URL, found by its place
(WEBHOOK_PATHS). Such a segment is `REDACTED` whole, in the canonical and the raw target.

The credential order is the same everywhere: the rule's own credential headers, then
`Authorization`, then `Cookie`. Reads send them all; which parts of a request make the
principal is intent/caller.py's.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection, Mapping, Sequence
from urllib.parse import unquote_plus

from proxy_addon.wire.canonical import canonical_encoding, param_value

REDACTED = "REDACTED"

# Names that carry credentials. They may identify the principal (as a keyed hash)
# but never enter a fingerprint's allowlist, the intent or the target URL.
SECRET_NAME = re.compile(
    r"(auth(?!or)|token|secret|passw|pwd|api[-_]?key|apikey|^key$|signature|^sig$|session|cookie|credential|^code$)",
    re.IGNORECASE,
)
ALWAYS_SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie"})
FALLBACK_CREDENTIALS = ("authorization", "cookie")
_QUERY_SEPARATOR = re.compile(r"([&;])")

# Names whose value is a caller's credential, counted in the principal without a rule naming
# them (intent/caller.py, fingerprint scheme 3). Narrower than SECRET_NAME, which redacts: a value that
# changes between a request and its retry (a signature, a nonce, a session, a CSRF or page
# token) would make the retry another caller, and a second write.
CREDENTIAL_NAME = re.compile(
    r"(token|secret|passw|pwd|api[-_]?key|apikey|^key$|^auth$|credential|access[-_]?key|private[-_]?key)",
    re.IGNORECASE,
)
NOT_A_CREDENTIAL = re.compile(r"(csrf|xsrf|nonce|signature|timestamp|page|cursor|next|continuation|idempotency)", re.I)
# Headers that look like credentials to SECRET_NAME but identify no caller of the upstream: the
# proxy's own (Proxy-Authorization), a response's (Set-Cookie), an MCP session (new on a reconnect).
NOT_CALLER_HEADERS = frozenset({"proxy-authorization", "set-cookie", "mcp-session-id"})

# The shapes of known token formats: a value that is one whole (after an auth scheme such as
# `Bearer `) is a credential wherever it is. Kept small: each is specific enough that no
# ordinary value has it (docs/rules.md, "Credentials").
TOKEN_SHAPES: dict[str, str] = {
    "stripe": r"(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{10,}",
    "sk- (OpenAI, Anthropic and others)": r"sk-[A-Za-z0-9_-]{20,}",
    "github": r"gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}",
    "slack": r"xox[abposr]-[A-Za-z0-9-]{10,}",
    "telegram bot (bot<token> in a path)": r"(?:bot)?[0-9]{6,}:[A-Za-z0-9_-]{30,}",
    "jwt": r"eyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*",
}
_TOKEN = re.compile("|".join(f"(?:{shape})" for shape in TOKEN_SHAPES.values()))
_SHORTEST_TOKEN = 15  # no shape above fits a shorter value
# Webhook URLs whose token is a path segment that has no shape of its own, found by its place.
WEBHOOK_PATHS = (
    re.compile(r"/services/T[A-Za-z0-9]+/B[A-Za-z0-9]+/(?P<token>[^/]+)"),  # Slack incoming webhooks
    re.compile(r"/api(?:/v[0-9]+)?/webhooks/[0-9]+/(?P<token>[^/]+)"),  # Discord webhooks
)


def is_secret_name(name: str) -> bool:
    """Whether a query parameter, header or field name looks like it carries a credential."""
    return SECRET_NAME.search(name) is not None


@functools.lru_cache(maxsize=4096)  # header, query and field names repeat from request to request
def is_credential_name(name: str) -> bool:
    """Whether a query parameter, header or field name says it holds a caller's credential (CREDENTIAL_NAME)."""
    return CREDENTIAL_NAME.search(name) is not None and NOT_A_CREDENTIAL.search(name) is None


def is_credential_param(name: str) -> bool:
    """Whether a path parameter's name says it holds a credential (`{webhook_token}`, `{api_key}`). A
    bare `{key}` does not: in a path it names an object (S3, key-value stores); declare it if it is one."""
    return name.lower() != "key" and is_credential_name(name)


def token_shaped(value: str) -> bool:
    """Whether a value is, whole, a token of a known format (TOKEN_SHAPES), alone or after an auth scheme."""
    text = value.strip()
    if len(text) < _SHORTEST_TOKEN:
        return False
    if _TOKEN.fullmatch(text):
        return True
    _, sep, rest = text.partition(" ")  # `Bearer <token>`
    return bool(sep) and _TOKEN.fullmatch(rest.strip()) is not None


def webhook_tokens(path: str) -> set[str]:
    """The tokens (decoded) a Slack or Discord webhook URL's path carries by their place (WEBHOOK_PATHS)."""
    bare = path.partition("?")[0]
    if "/services/" not in bare and "/webhooks/" not in bare:
        return set()
    return {segment_text(m.group("token")) for pattern in WEBHOOK_PATHS if (m := pattern.search(bare))}


def segment_text(segment: str) -> str:
    """A path segment as text, however it was percent-encoded (`bot1%3Ax` is `bot1:x`)."""
    return param_value(canonical_encoding(segment)) if "%" in segment else segment


def redact_path(path: str, secrets: Collection[str] = ()) -> str:
    """
    A path (no query) with every segment that carries a credential REDACTED: one that holds a
    value of `secrets` (decoded text), has a token's shape, or is a webhook's token by its place.
    """
    tokens = webhook_tokens(path)
    wanted = [s for s in secrets if s]
    if not tokens and not wanted and len(path) < _SHORTEST_TOKEN:
        return path
    segments = path.split("/")
    for i, segment in enumerate(segments):
        if not segment or (len(segment) < _SHORTEST_TOKEN and not tokens and not wanted):
            continue
        text = segment_text(segment)
        if text in tokens or token_shaped(text) or any(s in text for s in wanted):
            segments[i] = REDACTED
    return "/".join(segments)


def is_secret_header(name: str, credential_headers: Sequence[str] = ()) -> bool:
    """Whether a header (lower-case name) carries a credential: always-secret, the rule's own, or by its name."""
    return name in ALWAYS_SECRET_HEADERS or name in credential_headers or is_secret_name(name)


def credential_names(credential_headers: Sequence[str]) -> tuple[str, ...]:
    """The headers that may carry a credential, in the order that counts."""
    return (*credential_headers, *FALLBACK_CREDENTIALS)


def credentials_from(credential_headers: Sequence[str], headers: Mapping[str, str]) -> dict[str, str]:
    """The credential headers a request carries (lower-case names), in the order that counts."""
    return {h: headers[h] for h in credential_names(credential_headers) if headers.get(h)}


def redact_url(
    scheme: str, host: str, port: int, path: str, *, keep: Collection[str] = (), secrets: Collection[str] = ()
) -> str:
    """
    The request URL as it may be stored and logged: the value of every query parameter is
    REDACTED unless its name (percent-decoded) is in `keep` and does not look like a credential.
    The names stay, so the URL still says what was sent; a fragment is dropped. A path segment
    that carries a credential is REDACTED whole (redact_path; `secrets`: the decoded values of
    the path parameters that are credentials).
    """
    default = {"http": 80, "https": 443}.get(scheme)
    host = f"[{host}]" if ":" in host else host
    netloc = host if port == default else f"{host}:{port}"
    path, _, query = path.partition("?")
    path = redact_path(path, secrets)
    parts = []
    for piece in _QUERY_SEPARATOR.split(query.partition("#")[0]) if query else ():
        if piece in ("&", ";"):
            parts.append(piece)
            continue
        name, eq, _ = piece.partition("=")
        kept = unquote_plus(name) in keep and not is_secret_name(unquote_plus(name))
        if kept or not piece:
            parts.append(piece)
        else:
            parts.append(f"{name}={REDACTED}" if eq else REDACTED)  # a bare `?value` may be the secret itself
    return f"{scheme}://{netloc}{path}" + (f"?{''.join(parts)}" if parts else "")
