"""
Which operation a request is: the rules of every file, indexed by host, and the matching of
a request's host, method, path (canonical forms) and, for GraphQL rules, body; plus the
regex form of a rules host that mitmproxy's `allow_hosts` takes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from proxy_addon.canonical import canonical_host, canonical_path, ip_literal, method_overrides
from proxy_addon.json_body import NotStrict
from proxy_addon.mcp.calls import Refused, ToolCall, parse_message, read_call
from proxy_addon.rules.model import ANY_TOOL, Match, Operation, PathTemplate, RuleFile, same_value


@dataclass(frozen=True)
class RuleSet:
    files: tuple[RuleFile, ...] = ()
    _exact: Mapping[str, tuple[tuple[RuleFile, Operation], ...]] = field(default_factory=dict, repr=False)
    _wildcard: tuple[tuple[str, RuleFile, Operation], ...] = field(default=(), repr=False)

    @classmethod
    def of(cls, files: Iterable[RuleFile]) -> RuleSet:
        files = tuple(files)
        exact: dict[str, list] = {}
        wildcard = []
        for f in files:
            for host in f.hosts:
                for op in f.operations:
                    if host.startswith("*."):
                        wildcard.append((host[1:].lower(), f, op))
                    else:
                        exact.setdefault(_canonical_rule_host(host), []).append((f, op))
        return cls(files, {h: tuple(v) for h, v in exact.items()}, tuple(wildcard))

    @property
    def operations(self) -> tuple[Operation, ...]:
        return tuple(op for f in self.files for op in f.operations)

    def _candidates(self, host: str, port: int) -> tuple[tuple[RuleFile, Operation], ...]:
        """The operations of the files that name this host (exactly, with its port, or by a '*.' pattern)."""
        host = canonical_host(host)
        candidates = self._exact.get(f"{host}:{port}", ()) + self._exact.get(host, ())
        if self._wildcard:
            candidates += tuple(
                (f, op)
                for suffix, f, op in self._wildcard
                if (host.endswith(suffix.split(":")[0]) and (":" not in suffix or suffix.endswith(f":{port}")))
            )
        return candidates

    def files_for(self, host: str, port: int) -> list[RuleFile]:
        """The rules files that name this host."""
        return list({id(f): f for f, _ in self._candidates(host, port)}.values())

    def post_reads(self, api: str) -> tuple[PathTemplate, ...]:
        """The POST paths an API's file declares to be reads (`post_reads:`)."""
        return next((f.post_reads for f in self.files if f.api == api), ())

    def operation(self, api: str, name: str) -> Operation | None:
        for f in self.files:
            if f.api == api:
                return next((op for op in f.operations if op.name == name), None)
        return None

    def from_server(self, host: str, port: int, path: str) -> Operation | None:
        """The `mcp: {tools: from_server}` operation of the endpoint at this host and path, if a file has one."""
        path = canonical_path(path).split("?", 1)[0]
        return next(
            (
                op
                for _, op in self._candidates(host, port)
                if op.mcp_tool == ANY_TOOL and op.path.match(path) is not None
            ),
            None,
        )

    def match(
        self,
        host: str,
        port: int,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: Iterable[tuple[str | bytes, str | bytes]] | None = None,
    ) -> Match | None:
        """
        The first operation whose host, method and path template fit, or None. A GraphQL
        operation (`match.graphql`) also needs the body: without one, the first such candidate
        comes back `pending`; with one, only the mutation with that root field fits. The host
        and path are taken as sent: their canonical forms are matched (module docstring).

        `headers` (every (name, value) pair): a method override header (canonical.OVERRIDE_HEADERS)
        names the method matched, as a server that honours it takes it. The match is `refused`
        (the proxy answers 400, sends nothing) when that cannot be done without a guess: the headers
        name different methods; or the method named matches no operation while the method sent
        does (a server that ignores the header takes it as that write, one that honours it as
        something else); or an operation either method matches says `method_override: refuse`.
        None when neither method matches: the request is none of the rules' business. So an
        override adds receipts or is refused, never skips one.
        """
        candidates = self._candidates(host, port)
        if not candidates:
            return None
        path = canonical_path(path).split("?", 1)[0]
        found = method_overrides(headers) if headers is not None else []
        named = list(dict.fromkeys(m for _, m in found))
        if not named or named == [method]:
            return self._match(candidates, method, path, body, headers)
        hits = [
            (m, x) for m in dict.fromkeys([*named, method]) if (x := self._match(candidates, m, path, body, headers))
        ]
        if not hits:
            return None
        as_method, first = hits[0]  # the method named, if an operation has it, else the method sent
        shown = ", ".join(f"{h}: {m}" for h, m in found[:4]) + (", …" if len(found) > 4 else "")
        refusing = next((x.operation for _, x in hits if x.operation.method_override == "refuse"), None)
        if refusing is not None:
            why = (
                f"{method} with {shown}: {refusing.api} {refusing.name} does not take method override headers "
                f"(method_override: refuse, {refusing.source}:{refusing.line}); send the request with the method "
                "you mean and without them"
            )
            return replace(first, refused=why, refusal="method_override_refused")
        if len(named) > 1:
            why = (
                f"{method} with method override headers that name different methods ({shown}): which one "
                f"{first.operation.api} would take is a guess; send one of them, or none"
            )
            return replace(first, refused=why, refusal="method_override_refused")
        if as_method != named[0]:
            why = (
                f"{method} with {shown}: {first.operation.api} takes it as {named[0]}, which no operation matches, "
                f"if it honours the header, or as the {method} that {first.operation.name} matches if it ignores "
                "it; which one is a guess, so send the request with the method you mean and without the header"
            )
            return replace(first, refused=why, refusal="method_override_refused")
        return first

    @staticmethod
    def _match(
        candidates: tuple[tuple[RuleFile, Operation], ...],
        method: str,
        path: str,
        body: bytes | None,
        headers: Iterable[tuple[str | bytes, str | bytes]] | None = None,
    ) -> Match | None:
        """
        The first candidate with this method whose template fits the canonical `path` (no query
        string). On an MCP or GraphQL operation's endpoint, a body read two ways (json_body.py:
        not strict UTF-8 JSON, a key twice, keys that differ only by case) is `refused` as
        `bad_json`, whatever the message or operation it names.
        """
        mutation: dict[str, dict[str, Any]] | NotStrict | None = None
        parsed = False
        call: ToolCall | Refused | bool | None = False  # False: the body is not read as a tool call yet
        for _, op in candidates:
            if op.method == method:
                params = op.path.match(path)
                if params is None:
                    continue
                if op.mcp_tool is not None:
                    if body is None:
                        return Match(op, params, pending=True)
                    if call is False:
                        call = read_call(parse_message(body), _lower(headers))
                    if isinstance(call, Refused):  # on an MCP endpoint a rule names: 400, never sent
                        return Match(op, params, refused=call.why, refusal=call.reason)
                    if isinstance(call, ToolCall) and op_takes(op, call):
                        return Match(op, params, mcp_call=call)
                    continue
                if op.graphql is None:
                    return Match(op, params)
                if body is None:
                    return Match(op, params, pending=True)
                if not parsed:
                    from proxy_addon.gql import read_mutation  # graphql-core loads only for GraphQL rules

                    mutation, parsed = read_mutation(body), True
                if isinstance(mutation, NotStrict):  # on a GraphQL endpoint a rule names: 400, never sent
                    return Match(op, params, refused=mutation.why, refusal="bad_json")
                if mutation is not None and op.graphql in mutation:
                    return Match(op, params, graphql_args=mutation[op.graphql])
        return None


def op_takes(op: Operation, call: ToolCall) -> bool:
    """Whether an MCP operation names this call's tool, and the argument values it asks for."""
    return op.mcp_tool in (call.name, ANY_TOOL) and all(
        k in call.arguments and same_value(call.arguments[k], v) for k, v in op.mcp_arguments
    )


def _lower(headers: Iterable[tuple[str | bytes, str | bytes]] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in headers or ():
        name = (k.decode("latin-1") if isinstance(k, bytes) else k).lower()
        if name in ("mcp-method", "mcp-name") and name not in out:
            out[name] = v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) else v
    return out


def _canonical_rule_host(host: str) -> str:
    """A rules host (`name` or `name:port`) with its name in canonical form (`0x7f000001:8080` → `127.0.0.1:8080`)."""
    name, colon, port = host.rpartition(":") if host.count(":") == 1 else (host, "", "")
    return canonical_host(name) + colon + port


def host_pattern(host: str) -> str:
    """
    A rules host as a regex for mitmproxy's `allow_hosts`, which matches `host:port` strings.
    An IP address matches in every spelling that names it (`127.1`, `0x7f000001`,
    `::ffff:127.0.0.1`): a CONNECT to an alias must be intercepted too, or its writes would
    pass through the tunnel without a receipt.
    """
    name, _, port = host.partition(":")
    ip = ip_literal(name)
    if ip is not None and ":" not in ip:
        name_rx = _ipv4_spellings(ip)
    elif name.startswith("*."):
        name_rx = r"(?:[^.:]+\.)+" + re.escape(name[2:])
    else:
        name_rx = re.escape(name)
    port_rx = re.escape(port) if port else "[0-9]+"
    return rf"^{name_rx}\.?:{port_rx}$"


def _ipv4_spellings(ip: str) -> str:
    """A regex for every spelling of an IPv4 address: 1 to 4 numbers (decimal, octal or hex), or IPv4-mapped IPv6."""
    value = int.from_bytes(bytes(int(b) for b in ip.split(".")), "big")
    octets = [(value >> s) & 0xFF for s in (24, 16, 8, 0)]

    def number(n: int) -> str:
        return "(?:0x0*|0+)" if n == 0 else f"(?:{n}|0x0*{n:x}|0+{n:o})"

    forms = [
        number(value),
        number(octets[0]) + r"\." + number(value & 0xFFFFFF),
        number(octets[0]) + r"\." + number(octets[1]) + r"\." + number(value & 0xFFFF),
        r"\.".join(number(o) for o in octets),
    ]
    mapped = rf"\[?[0:]*ffff:(?:{re.escape(ip)}|0*{value >> 16:x}:0*{value & 0xFFFF:x})\]?"
    return "(?:" + "|".join([*forms, mapped]) + ")"
