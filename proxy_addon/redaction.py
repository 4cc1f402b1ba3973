"""
Secrets: which names carry credentials, how they are redacted, and which header counts.

    is_secret_name("access_token")           # True: never in a fingerprint, the intent or a URL
    redact_url("https", "api.test", 443, "/x?token=s&page=2")   # "https://api.test/x?token=REDACTED&page=REDACTED"
    redact_url("https", "api.test", 443, "/x?token=s&page=2", keep=("page",))   # "...?token=REDACTED&page=2"
    credentials_from(("api-key",), headers)  # the credential headers a request carries, in order

URLs are redacted by default: a stored or logged URL keeps the value of a query parameter
only when its name is in `keep` (the parameters the rule's fingerprint names, or a read's
template writes) and does not look like a credential. Every other value is REDACTED,
whatever its name (`?jwt=`, `?x_thing=`), and a bare `?value` with no name too.

The credential order is the same everywhere: the rule's own credential headers, then
`Authorization`, then `Cookie`. The principal hashes every one of the rule's own that is
present (else the first of the other two: fingerprint.principal_of); reads send them all.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from urllib.parse import unquote_plus

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


def is_secret_name(name: str) -> bool:
    """Whether a query parameter, header or field name looks like it carries a credential."""
    return SECRET_NAME.search(name) is not None


def is_secret_header(name: str, credential_headers: Sequence[str] = ()) -> bool:
    """Whether a header (lower-case name) carries a credential: always-secret, the rule's own, or by its name."""
    return name in ALWAYS_SECRET_HEADERS or name in credential_headers or is_secret_name(name)


def credential_names(credential_headers: Sequence[str]) -> tuple[str, ...]:
    """The headers that may carry a credential, in the order that counts."""
    return (*credential_headers, *FALLBACK_CREDENTIALS)


def credentials_from(credential_headers: Sequence[str], headers: Mapping[str, str]) -> dict[str, str]:
    """The credential headers a request carries (lower-case names), in the order that counts."""
    return {h: headers[h] for h in credential_names(credential_headers) if headers.get(h)}


def redact_url(scheme: str, host: str, port: int, path: str, *, keep: Collection[str] = ()) -> str:
    """
    The request URL as it may be stored and logged: the value of every query parameter is
    REDACTED unless its name (percent-decoded) is in `keep` and does not look like a credential.
    The names stay, so the URL still says what was sent; a fragment is dropped.
    """
    default = {"http": 80, "https": 443}.get(scheme)
    host = f"[{host}]" if ":" in host else host
    netloc = host if port == default else f"{host}:{port}"
    path, _, query = path.partition("?")
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
