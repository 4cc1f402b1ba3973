"""
Spellings of one write through a real proxy, to an upstream that routes like nginx
(tests/upstream.py NginxUpstream: `merge_slashes`, dot segments, percent-decoded unreserved
characters), so every spelling below reaches the same handler. Each spelling gets a receipt
(none slips past the rules), the spellings are one intent (the second is replayed, or
blocked while the first is unresolved), and the upstream sees exactly one write, sent as the
agent wrote it. `/API/...` is another path unless the rule says `case_insensitive: true`.

The odd paths are sent with `curl --path-as-is` (requests, httpx and curl itself would
otherwise remove the dot segments before sending); the numeric host aliases with requests,
which sends the host as written.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from proxy_addon.store import Store
from tests.conftest import RECORDED_TOKEN, ROOT, SECRETS
from tests.e2e.processes import SECRETS_HEADERS, Answer, Clients, Proxy
from tests.e2e.proxy.test_integration import events_of
from tests.upstream import NginxUpstream

RULES = """\
api: canon-api
hosts: [127.0.0.1]
credentials: {header: api-key}
operations:
  things.create:
    match: {method: POST, path: "/api/{bucket}/things"}
    fingerprint: {body: [title]}
    external_id: id
  items.create:
    match: {method: POST, path: "/api/{bucket}/items/{item}"}
    fingerprint: {body: [title]}
    external_id: id
  cased.create:
    description: An API that ignores letter case in its paths
    match: {method: POST, path: "/api/{bucket}/cased", case_insensitive: true}
    fingerprint: {body: [title]}
    external_id: id
"""


@pytest.fixture(scope="module")
def nginx():
    with NginxUpstream() as up:
        yield up


@pytest.fixture(scope="module")
def nginx_ci():
    with NginxUpstream(fold_case=True) as up:
        yield up


@pytest.fixture(scope="module")
def nginx_tls(tmp_path_factory):
    with NginxUpstream(tls=True, certdir=tmp_path_factory.mktemp("nginx-cert")) as up:
        yield up


@pytest.fixture(scope="module")
def canon_proxy(tmp_path_factory, confdir, nginx_tls):
    work = tmp_path_factory.mktemp("canon-proxy")
    rules = work / "rules"
    rules.mkdir()
    (rules / "canon.yaml").write_text(RULES)
    p = Proxy(work, confdir, rules=rules, upstream_ca=nginx_tls.cert_path).start()
    yield p
    p.stop()


@pytest.fixture
def canon_clients(canon_proxy) -> Clients:
    return Clients(canon_proxy)


# The marker secrets Clients.send puts in every query string (tests/conftest.py), sent here too.
QUERY = "&".join(f"{name}={SECRETS[name]}" for name in ("token", "x_thing") if name in SECRETS)


def stored(url: str) -> tuple[str, bool]:
    """A stored URL as (without its query, whether every query value is REDACTED)."""
    base, _, query = url.partition("?")
    return base, all(pair.endswith("=REDACTED") for pair in query.split("&"))


def as_is(proxy: Proxy, method: str, url: str, body: bytes) -> Answer:
    """curl --path-as-is through the proxy, with the marker credentials and query that Clients.send adds."""
    url = f"{url}{'&' if '?' in url else '?'}{QUERY}"
    cmd = [
        "curl",
        "-sS",
        "--path-as-is",
        "-X",
        method,
        "-D",
        "-",
        "--max-time",
        "10",
        "--cacert",
        str(proxy.ca),
        "-H",
        "Content-Type: application/json",
        "--data-binary",
        "@-",
    ]
    for k, v in SECRETS_HEADERS.items():
        cmd += ["-H", f"{k}: {v}"]
    env = {**os.environ, "http_proxy": proxy.url, "HTTPS_PROXY": proxy.url, "NO_PROXY": "", "no_proxy": ""}
    p = subprocess.run([*cmd, url], input=body, capture_output=True, env=env, timeout=20)
    assert p.returncode == 0, p.stderr
    head, _, rest = p.stdout.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if "x-receipt-id" in headers and proxy not in RECORDED_TOKEN:
        RECORDED_TOKEN.append(proxy)  # the end-of-run sweep then checks token=REDACTED was recorded
    return Answer(int(lines[0].split()[1]), headers, rest)


def receipts_of(proxy: Proxy, bucket: str) -> list:
    store = Store.open(proxy.db, create=False)
    try:
        return [r for r in store.list(limit=None) if bucket in r.target]
    finally:
        store.close()


def writes_to(up: NginxUpstream, bucket: str) -> list[str]:
    """The request targets of every write the upstream received for this bucket, as they arrived."""
    with up.lock:
        return [
            r["target"].split("?")[0] for r in up.requests if r["method"] == "POST" and bucket in up.route(r["target"])
        ]


# (id, the first spelling, the canonical path the upstream routes it to); {b} is the test's bucket.
SPELLINGS = [
    ("encoded-letter", "/api/{b}/thing%73", "/api/{b}/things"),
    ("double-slash", "//api/{b}/things", "/api/{b}/things"),
    ("dot-segment", "/api/{b}/./things", "/api/{b}/things"),
    ("dot-dot-segment", "/api/x/../{b}/things", "/api/{b}/things"),
    ("encoded-dot-dot", "/api/x/%2e%2E/{b}/things", "/api/{b}/things"),
    ("encoded-path-parameter", "/api/%62{rest}/things", "/api/{b}/things"),
    ("encoded-lower-hex", "/api/{b}/%74hings", "/api/{b}/things"),
    ("all-at-once", "//api/./x/../%62{rest}//thing%73", "/api/{b}/things"),
    ("encoded-item-parameter", "/api/{b}/items/%745", "/api/{b}/items/t5"),
]


@pytest.mark.parametrize("spelled, canonical", [s[1:] for s in SPELLINGS], ids=[s[0] for s in SPELLINGS])
def test_spellings_of_a_path_are_one_write(spelled, canonical, canon_proxy, canon_clients, nginx, bucket):
    spelled = spelled.format(b=bucket, rest=bucket[1:])
    canonical = canonical.format(b=bucket)
    body = {"title": "one write"}

    first = as_is(canon_proxy, "POST", nginx.url + spelled, b'{"title": "one write"}')
    assert first.status == 201, first
    assert first.headers.get("x-receipt-id"), "the spelling slipped past the rules: no receipt"
    assert writes_to(nginx, bucket) == [spelled]  # forwarded as the agent wrote it, not rewritten
    (receipt,) = receipts_of(canon_proxy, bucket)
    assert receipt.operation_id == first.headers["x-receipt-id"]
    assert stored(receipt.target) == (f"{nginx.url}{canonical}", True)
    assert stored(receipt.raw_target) == (f"{nginx.url}{spelled}", True)  # redacted like target

    second = canon_clients.send("requests", "POST", nginx.url + canonical, body)
    assert second.status == 201
    assert second.headers["x-receipt-id"] == receipt.operation_id
    assert second.headers["x-receipt-replayed"] == "true"
    assert second.body == first.body
    assert nginx.commits(canonical) == 1
    assert writes_to(nginx, bucket) == [spelled]  # the canonical spelling never went out
    assert [r.operation_id for r in receipts_of(canon_proxy, bucket)] == [receipt.operation_id]
    assert events_of(canon_proxy, receipt.operation_id)[-1] == ("replayed", "succeeded", "succeeded")


def test_a_second_spelling_of_an_unresolved_write_is_blocked(canon_proxy, nginx, bucket):
    canonical = f"/api/{bucket}/things"
    nginx.plan(canonical, "drop")  # commits, then drops the connection: outcome_unknown
    first = as_is(canon_proxy, "POST", f"{nginx.url}//api/{bucket}/./things", b'{"title": "unresolved"}')
    assert first.status == 502 and first.json()["error"] == "outcome_unknown"
    second = as_is(canon_proxy, "POST", f"{nginx.url}/api/{bucket}/thing%73", b'{"title": "unresolved"}')
    assert second.status == 409
    assert (second.json()["error"], second.json()["state"]) == ("duplicate_unresolved", "outcome_unknown")
    assert nginx.commits(canonical) == 1
    assert writes_to(nginx, bucket) == [f"//api/{bucket}/./things"]
    (receipt,) = receipts_of(canon_proxy, bucket)
    assert receipt.state == "outcome_unknown"
    assert events_of(canon_proxy, receipt.operation_id)[-1] == ("blocked", "outcome_unknown", "outcome_unknown")


ALIASES = ["127.1", "127.0.1", "2130706433", "0x7f000001", "0177.0.0.1", "[::ffff:127.0.0.1]"]


@pytest.mark.parametrize("alias", ALIASES)
def test_numeric_aliases_of_the_host_are_one_write(alias, canon_proxy, canon_clients, nginx, bucket):
    path = f"/api/{bucket}/things"
    first = canon_clients.send("requests", "POST", f"http://{alias}:{nginx.port}{path}", {"title": alias})
    assert first.status == 201, first
    assert first.headers.get("x-receipt-id"), "the alias slipped past the rules: no receipt"
    with nginx.lock:
        (sent,) = [r for r in nginx.requests if bucket in r["path"]]
    assert sent["headers"]["Host"] == f"{alias}:{nginx.port}"  # forwarded as the agent wrote it
    (receipt,) = receipts_of(canon_proxy, bucket)
    assert stored(receipt.target) == (f"http://127.0.0.1:{nginx.port}{path}", True)
    assert stored(receipt.raw_target) == (f"http://{alias}:{nginx.port}{path}", True)

    second = canon_clients.send("requests", "POST", f"http://127.0.0.1:{nginx.port}{path}", {"title": alias})
    assert (second.status, second.headers["x-receipt-id"]) == (201, receipt.operation_id)
    assert second.headers["x-receipt-replayed"] == "true"
    assert nginx.commits(path) == 1
    assert len(receipts_of(canon_proxy, bucket)) == 1


@pytest.mark.parametrize("alias", ["127.1", "2130706433"])
def test_a_connect_to_an_alias_of_an_ip_host_is_intercepted(alias, canon_proxy, nginx_tls, bucket, tmp_path):
    """
    The allow_hosts pattern of 127.0.0.1 matched only '127.0.0.1:port': a CONNECT to 127.1 was
    tunnelled untouched, and its write reached the upstream with no receipt (when the agent
    accepted the upstream's certificate for that name). Here the agent trusts the proxy's CA
    and the upstream's certificate, which names 127.0.0.1 only: a tunnel fails its TLS check.
    """
    import requests

    bundle = tmp_path / "cas.pem"
    bundle.write_bytes(canon_proxy.ca.read_bytes() + nginx_tls.cert_path.read_bytes())
    path = f"/api/{bucket}/things"

    def send(host: str) -> requests.Response:
        return requests.post(
            f"https://{host}:{nginx_tls.port}{path}?{QUERY}",
            json={"title": "tls"},
            headers=SECRETS_HEADERS,
            verify=str(bundle),
            timeout=10,
            proxies={"https": canon_proxy.url},
        )

    try:
        first = send(alias)
    except requests.exceptions.SSLError as e:  # the upstream's own certificate, which names 127.0.0.1 only
        raise AssertionError(f"the CONNECT to {alias} was tunnelled past the rules to the upstream: {e}") from None
    assert first.status_code == 201
    assert first.headers.get("x-receipt-id"), "the CONNECT to an alias was tunnelled past the rules"
    if canon_proxy not in RECORDED_TOKEN:
        RECORDED_TOKEN.append(canon_proxy)
    second = send("127.0.0.1")
    assert (second.headers["x-receipt-id"], second.headers["x-receipt-replayed"]) == (
        first.headers["x-receipt-id"],
        "true",
    )
    assert nginx_tls.commits(path) == 1


def test_a_path_in_other_letter_case_is_another_path(canon_proxy, canon_clients, nginx, bucket):
    """Paths are case-sensitive (RFC 3986 §6.2.2.1; nginx too): /API/... is not the rule's path, and goes through
    untouched, to the other handler it names."""
    upper = canon_clients.send("requests", "POST", f"{nginx.url}/API/{bucket}/things", {"title": "case"})
    assert upper.status == 201 and "x-receipt-id" not in upper.headers
    assert receipts_of(canon_proxy, bucket) == []
    lower = canon_clients.send("requests", "POST", f"{nginx.url}/api/{bucket}/things", {"title": "case"})
    assert lower.status == 201 and "x-receipt-replayed" not in lower.headers
    assert lower.headers["x-receipt-id"]
    assert (nginx.commits(f"/API/{bucket}/things"), nginx.commits(f"/api/{bucket}/things")) == (1, 1)


def test_case_insensitive_true_makes_them_one_write(canon_proxy, canon_clients, nginx_ci, bucket):
    first = as_is(canon_proxy, "POST", f"{nginx_ci.url}/API/{bucket}/CASED", b'{"title": "case"}')
    assert first.status == 201 and first.headers.get("x-receipt-id")
    second = canon_clients.send("requests", "POST", f"{nginx_ci.url}/api/{bucket}/cased", {"title": "case"})
    assert (second.headers["x-receipt-id"], second.headers["x-receipt-replayed"]) == (
        first.headers["x-receipt-id"],
        "true",
    )
    assert nginx_ci.commits(f"/api/{bucket}/cased") == 1
    assert writes_to(nginx_ci, bucket) == [f"/API/{bucket}/CASED"]


def test_receipts_show_prints_the_target_as_sent(canon_proxy, nginx, bucket, capsys):
    from proxy_addon import cli

    first = as_is(canon_proxy, "POST", f"{nginx.url}//api/{bucket}/thing%73", b'{"title": "shown"}')
    rid = first.headers["x-receipt-id"]
    assert cli.main(["--db", str(canon_proxy.db), "show", rid]) == 0
    out = capsys.readouterr().out
    assert f"target              {nginx.url}/api/{bucket}/things?token=REDACTED" in out
    assert f"raw_target          {nginx.url}//api/{bucket}/thing%73?token=REDACTED" in out
    assert SECRETS["token"] not in out
    plain = as_is(canon_proxy, "POST", f"{nginx.url}/api/{bucket}/things", b'{"title": "plain"}')
    assert cli.main(["--db", str(canon_proxy.db), "show", plain.headers["x-receipt-id"]]) == 0
    assert "raw_target" not in capsys.readouterr().out  # sent in its canonical form: nothing more to say


def test_the_receipt_view_shows_the_target_as_sent(canon_proxy, nginx, bucket):
    from proxy_addon.mitm.web import describe

    first = as_is(canon_proxy, "POST", f"{nginx.url}/api/{bucket}/./things", b'{"title": "view"}')
    store = Store.open(canon_proxy.db, create=False)
    try:
        text = describe(store, first.headers["x-receipt-id"])
    finally:
        store.close()
    assert f"sent as          POST {nginx.url}/api/{bucket}/./things?token=REDACTED" in text
    assert SECRETS["token"] not in text


def test_these_rules_validate_against_the_schema():
    """The schema editors use accepts case_insensitive (tests/test_rules_schema.py checks it names the key)."""
    import json

    import jsonschema
    import yaml

    from proxy_addon.rules import load_rules

    load_rules(RULES, "canon.yaml")
    schema = json.loads((ROOT / "proxy_addon" / "rules.schema.json").read_text())
    assert list(jsonschema.Draft7Validator(schema).iter_errors(yaml.safe_load(RULES))) == []
