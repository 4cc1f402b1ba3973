"""
Which operation a request is: the rules of every file, indexed by host, and the matching of
a request's host, method, path (canonical forms) and, for GraphQL rules, body; plus the
regex form of a rules host that mitmproxy's `allow_hosts` takes.

Loopback names (canonical.LOOPBACK: `localhost`, `127.0.0.1`, `::1`, `0.0.0.0`, `::`) reach the
same sockets: a file that names one of them is also the file of the others. A request matched
only through such an alias is fingerprinted with the host the rule names (`Match.fingerprint_host`),
so that `localhost` and `127.0.0.1` are one intent; a request to the host the rule names is
matched and fingerprinted as it always was.

A request target that servers read differently (a fragment, `;` path parameters:
canonical.readings) is refused (`Match.refused`, `refused_as` AMBIGUOUS_TARGET) when any of its
readings is a write a rule matches, and is none of the rules' business when none is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from proxy_addon.rules.model import ANY_TOOL, Match, Operation, PathTemplate, RuleFile, same_value
from proxy_addon.wire.canonical import LOOPBACK, canonical_host, canonical_path, ip_literal, method_overrides, readings
from proxy_addon.wire.json_body import NotStrict
from proxy_addon.wire.mcp_calls import Refused, ToolCall, parse_message, read_call

AMBIGUOUS_TARGET = "ambiguous_target"  # Match.refused_as: a fragment or path parameters servers read differently

# A candidate operation: its file, itself, and the host its fingerprint takes in place of the request's
# (the loopback name the rule names, when the request reached it through another one), else None.
Candidate = tuple[RuleFile, Operation, str | None]


@dataclass(frozen=True)
class RuleSet:
    files: tuple[RuleFile, ...] = ()
    _exact: Mapping[str, tuple[tuple[RuleFile, Operation], ...]] = field(default_factory=dict, repr=False)
    _wildcard: tuple[tuple[str, RuleFile, Operation], ...] = field(default=(), repr=False)
    # (port or 0 for any, the loopback name as the rule names it, its file, the operation): canonical.LOOPBACK
    _loopback: tuple[tuple[int, str, RuleFile, Operation], ...] = field(default=(), repr=False)

    @classmethod
    def of(cls, files: Iterable[RuleFile]) -> RuleSet:
        files = tuple(files)
        exact: dict[str, list] = {}
        wildcard = []
        loopback = []
        for f in files:
            for host in f.hosts:
                for op in f.operations:
                    if host.startswith("*."):
                        wildcard.append((host[1:].lower(), f, op))
                    else:
                        name, port = _canonical_rule_host(host)
                        exact.setdefault(f"{name}:{port}" if port else name, []).append((f, op))
                        if name in LOOPBACK:
                            loopback.append((port, name, f, op))
        return cls(files, {h: tuple(v) for h, v in exact.items()}, tuple(wildcard), tuple(loopback))

    @property
    def operations(self) -> tuple[Operation, ...]:
        return tuple(op for f in self.files for op in f.operations)

    def _candidates(self, host: str, port: int) -> tuple[Candidate, ...]:
        """
        The operations of the files that name this host (exactly, with its port, or by a '*.'
        pattern), then, for a loopback name, those of the files that name another loopback name.
        """
        host = canonical_host(host)
        candidates: tuple[Candidate, ...] = tuple(
            (f, op, None) for f, op in self._exact.get(f"{host}:{port}", ()) + self._exact.get(host, ())
        )
        if self._wildcard:
            candidates += tuple(
                (f, op, None)
                for suffix, f, op in self._wildcard
                if (host.endswith(suffix.split(":")[0]) and (":" not in suffix or suffix.endswith(f":{port}")))
            )
        if self._loopback and host in LOOPBACK:
            named = {id(op) for _, op, _ in candidates}
            for rule_port, name, f, op in self._loopback:
                if name != host and rule_port in (0, port) and id(op) not in named:
                    named.add(id(op))
                    candidates += ((f, op, name),)
        return candidates

    def files_for(self, host: str, port: int) -> list[RuleFile]:
        """The rules files that name this host."""
        return list({id(f): f for f, _, _ in self._candidates(host, port)}.values())

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
                for _, op, _ in self._candidates(host, port)
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

        A request target that servers read differently (a fragment, `;` path parameters:
        canonical.readings) is `refused` (`refused_as` AMBIGUOUS_TARGET) when any of its readings
        matches; None when none does.
        """
        candidates = self._candidates(host, port)
        if not candidates:
            return None
        alternatives = readings(path)
        if len(alternatives) == 1:
            return self._match_target(candidates, method, path, body, headers)
        for reading in alternatives:
            hit = self._match_target(candidates, method, reading, body, headers)
            if hit is not None:
                return replace(hit, refused=_ambiguous(path, reading, hit.operation), refused_as=AMBIGUOUS_TARGET)
        return None

    def _match_target(
        self,
        candidates: tuple[Candidate, ...],
        method: str,
        path: str,
        body: bytes | None,
        headers: Iterable[tuple[str | bytes, str | bytes]] | None,
    ) -> Match | None:
        """`match` of one reading of the request target, method override headers included."""
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
            return replace(first, refused=why, refused_as=None)
        if len(named) > 1:
            why = (
                f"{method} with method override headers that name different methods ({shown}): which one "
                f"{first.operation.api} would take is a guess; send one of them, or none"
            )
            return replace(first, refused=why, refused_as=None)
        if as_method != named[0]:
            why = (
                f"{method} with {shown}: {first.operation.api} takes it as {named[0]}, which no operation matches, "
                f"if it honours the header, or as the {method} that {first.operation.name} matches if it ignores "
                "it; which one is a guess, so send the request with the method you mean and without the header"
            )
            return replace(first, refused=why, refused_as=None)
        return first

    @staticmethod
    def _match(
        candidates: tuple[Candidate, ...],
        method: str,
        path: str,
        body: bytes | None,
        headers: Iterable[tuple[str | bytes, str | bytes]] | None = None,
    ) -> Match | None:
        """
        The first candidate with this method whose template fits the canonical `path` (no query
        string). On an MCP or GraphQL operation's endpoint, a body read two ways (wire/json_body.py:
        not strict UTF-8 JSON, a key twice, keys that differ only by case) is `refused` as
        `bad_json`, whatever the message or operation it names.
        """
        mutation: dict[str, dict[str, Any]] | NotStrict | None = None
        parsed = False
        call: ToolCall | Refused | bool | None = False  # False: the body is not read as a tool call yet
        for _, op, alias in candidates:
            if op.method == method:
                params = op.path.match(path)
                if params is None:
                    continue
                found: Match | None = None
                if op.mcp_tool is not None:
                    if body is None:
                        found = Match(op, params, pending=True)
                    else:
                        if call is False:
                            call = read_call(parse_message(body), _lower(headers))
                        if isinstance(call, Refused):  # on an MCP endpoint a rule names: 400, never sent
                            found = Match(op, params, refused=call.why, refused_as=call.reason)
                        elif isinstance(call, ToolCall) and op_takes(op, call):
                            found = Match(op, params, mcp_call=call)
                elif op.graphql is None:
                    found = Match(op, params)
                elif body is None:
                    found = Match(op, params, pending=True)
                else:
                    if not parsed:
                        from proxy_addon.wire.gql import read_mutation  # graphql-core loads only for GraphQL rules

                        mutation, parsed = read_mutation(body), True
                    if isinstance(mutation, NotStrict):  # on a GraphQL endpoint a rule names: 400, never sent
                        found = Match(op, params, refused=mutation.why, refused_as="bad_json")
                    elif mutation is not None and op.graphql in mutation:
                        found = Match(op, params, graphql_args=mutation[op.graphql])
                if found is not None:
                    return found if alias is None else replace(found, fingerprint_host=alias)
        return None


def op_takes(op: Operation, call: ToolCall) -> bool:
    """Whether an MCP operation names this call's tool, and the argument values it asks for. The
    `from_server` operation takes every tool but those the rules name reads (`mcp.read_only_tools`)."""
    if op.mcp_tool == ANY_TOOL and call.name in op.mcp_read_tools:
        return False
    return op.mcp_tool in (call.name, ANY_TOOL) and all(
        k in call.arguments and same_value(call.arguments[k], v) for k, v in op.mcp_arguments
    )


def _lower(headers: Iterable[tuple[str | bytes, str | bytes]] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in headers or ():
        name = (k.decode("latin-1") if isinstance(k, bytes) else k).lower()
        if name in ("mcp-method", "mcp-name", "mcp-protocol-version") and name not in out:
            out[name] = v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) else v
    return out


def _canonical_rule_host(host: str) -> tuple[str, int]:
    """A rules host (`name` or `name:port`): its name in canonical form and its port, 0 for any
    (`0x7f000001:8080` → ("127.0.0.1", 8080))."""
    name, _, port = host.rpartition(":") if host.count(":") == 1 else (host, "", "")
    return canonical_host(name), int(port) if port.isdecimal() else 0


def _ambiguous(sent: str, reading: str, op: Operation) -> str:
    """Why a request target servers read differently is refused: what it has, and the write it can be."""
    parts = [
        *(["a fragment (#…), which RFC 9110 says is never sent"] if "#" in sent else []),
        *(["path parameters (;…)"] if ";" in sent.partition("#")[0].partition("?")[0] else []),
    ]
    return (
        f"the request target has {' and '.join(parts)}, which servers read differently (Werkzeug and Express "
        "drop a fragment, uvicorn and Go's net/http keep it in the path; Tomcat, Jetty and Spring remove "
        "path parameters from every segment, Werkzeug, Starlette, Express and nginx keep them), and read as "
        f"{canonical_path(reading).split('?', 1)[0]} it is {op.api} {op.name} ({op.source}:{op.line}); send it "
        "without the fragment, and a ';' that belongs in a path value as %3B"
    )


def host_pattern(host: str) -> str:
    """
    A rules host as a regex for mitmproxy's `allow_hosts`, which matches `host:port` strings.
    An IP address matches in every spelling that names it (`127.1`, `0x7f000001`,
    `::ffff:127.0.0.1`): a CONNECT to an alias must be intercepted too, or its writes would
    pass through the tunnel without a receipt. A loopback name matches every loopback name
    (`localhost`, `127.0.0.1`, `::1`, `0.0.0.0`, `::`, in every spelling), as RuleSet matches them.
    """
    name, _, port = host.partition(":")
    ip = ip_literal(name)
    if canonical_host(name) in LOOPBACK:  # every loopback name: a rule naming one names them all (RuleSet)
        ipv4 = "|".join(_ipv4_spellings(a) for a in ("127.0.0.1", "0.0.0.0"))
        name_rx = f"(?:localhost|{ipv4}|{_V6_LOCAL})"
    elif ip is not None and ":" not in ip:
        name_rx = _ipv4_spellings(ip)
    elif name.startswith("*."):
        name_rx = r"(?:[^.:]+\.)+" + re.escape(name[2:])
    else:
        name_rx = re.escape(name)
    port_rx = re.escape(port) if port else "[0-9]+"
    return rf"^{name_rx}\.?:{port_rx}$"


_V6_LOCAL = r"\[?[0:]*:(?:0{0,3}1)?\]?"  # `::1` and `::` in every IPv6 spelling (0:0:0:0:0:0:0:1, [::1])


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
