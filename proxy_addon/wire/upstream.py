"""
How the proxy reaches upstreams: TLS verification and an optional upstream proxy.

One value, `Upstream`, serves both the exchange that forwards a matched write and the
reconcile reads, from the proxy and from the CLI alike, so a read never trusts what the
write would not (or the reverse).

    up = Upstream(ca_file="/etc/ssl/private-ca.pem")     # the proxy: from mitmproxy's options
    up = Upstream.from_env(ca_file=args.cacert)           # the CLI: --cacert, else $SSL_CERT_FILE
    async with up.client(timeout=30) as client: ...      # an httpx client (the reads)
    pool = up.pool(max_keepalive=64)                      # the same, as httpcore's pool (the exchange)

Verification: `insecure` turns it off; else `ca_file` and/or `ca_dir` are trusted, and
without either, certifi's bundle (as mitmproxy does).
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from typing import Any

import certifi
import httpcore
import httpx


@dataclass(frozen=True)
class Upstream:
    insecure: bool = False  # mitmproxy's ssl_insecure; the CLI's --insecure
    ca_file: str | None = None  # ssl_verify_upstream_trusted_ca; --cacert, $SSL_CERT_FILE
    ca_dir: str | None = None  # ssl_verify_upstream_trusted_confdir
    proxy: str | None = None  # an upstream proxy's URL (mitmproxy's upstream:URL mode)
    proxy_auth: str | None = None  # user:password for that proxy (upstream_auth)
    http2: bool = False

    @classmethod
    def from_env(cls, *, ca_file: str | None = None, insecure: bool = False) -> Upstream:
        """For the CLI: an explicit CA file, else $SSL_CERT_FILE / $SSL_CERT_DIR, as OpenSSL's clients honour them."""
        return cls(
            insecure=insecure,
            ca_file=ca_file or os.environ.get("SSL_CERT_FILE") or None,
            ca_dir=None if ca_file else os.environ.get("SSL_CERT_DIR") or None,
        )

    def verify(self) -> ssl.SSLContext | bool:
        """The TLS verification httpx should apply."""
        if self.insecure:
            return False
        return ssl.create_default_context(
            cafile=self.ca_file or (None if self.ca_dir else certifi.where()), capath=self.ca_dir or None
        )

    def proxy_spec(self) -> httpx.Proxy | None:
        if not self.proxy:
            return None
        auth = None
        if self.proxy_auth:
            user, _, password = self.proxy_auth.partition(":")
            auth = (user, password)
        return httpx.Proxy(self.proxy, auth=auth)

    def pool(self, *, max_keepalive: int = 64, keepalive_expiry: float = 5.0) -> httpcore.AsyncConnectionPool:
        """
        httpcore's connection pool, built as httpx's transport builds it for `client()` (same TLS
        context, proxy and auth, HTTP/2 switch; no limit on connections), for a caller that sends
        through httpcore directly. Its errors are httpcore's: httpx maps them to its own.
        """
        ssl_context = httpx.create_ssl_context(verify=self.verify(), trust_env=False)
        proxy = self.proxy_spec()
        if proxy is None:
            return httpcore.AsyncConnectionPool(
                ssl_context=ssl_context,
                max_connections=None,
                max_keepalive_connections=max_keepalive,
                keepalive_expiry=keepalive_expiry,
                http2=self.http2,
            )
        if proxy.url.scheme not in ("http", "https"):
            raise ValueError(f"an upstream proxy must be http or https, not {proxy.url.scheme!r}")
        return httpcore.AsyncHTTPProxy(
            proxy_url=httpcore.URL(
                scheme=proxy.url.raw_scheme, host=proxy.url.raw_host, port=proxy.url.port, target=proxy.url.raw_path
            ),
            proxy_auth=proxy.raw_auth,
            proxy_headers=proxy.headers.raw,
            ssl_context=ssl_context,
            proxy_ssl_context=proxy.ssl_context,
            max_connections=None,
            max_keepalive_connections=max_keepalive,
            keepalive_expiry=keepalive_expiry,
            http2=self.http2,
        )

    def client(self, *, timeout: Any = None, **kwargs: Any) -> httpx.AsyncClient:
        """An httpx client that verifies and proxies as configured. It never reads the environment itself."""
        return httpx.AsyncClient(
            verify=self.verify(), proxy=self.proxy_spec(), http2=self.http2, trust_env=False, timeout=timeout, **kwargs
        )
