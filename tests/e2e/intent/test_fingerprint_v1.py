"""
Scheme 1 (intent/fingerprint_v1.py) gives what commit dc97d6d's own `fingerprint()` gave: that
commit's package (tests/earlier/, see tests/e2e/proxy/test_upgrade.py) runs in a subprocess over a
corpus. The other schemes and earlier versions: tests/intent/test_earlier_fingerprints.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import unicodedata

import pytest

from proxy_addon.intent.fingerprint import fingerprint
from proxy_addon.intent.fingerprint_v1 import fingerprint_v1
from proxy_addon.rules import RuleSet, load_rules
from tests.conftest import ROOT
from tests.intent.test_earlier_fingerprints import FORM, JSON, KEY, RULES, match, view

HERE = ROOT / "tests"


EARLIER = HERE / "earlier" / "proxy_addon-dc97d6d.tar.gz"


NFD = unicodedata.normalize("NFD", "café")


# (name, method, host, port, path, headers, body): requests scheme 1 reads, many of them otherwise than today.
CORPUS = [
    (
        "plain",
        "POST",
        "api.shop.test",
        443,
        "/v1/stores/s1/orders",
        {**JSON, "api-key": "k1"},
        b'{"order": {"title": "t"}, "items": [{"sku": "a"}]}',
    ),
    (
        "bearer",
        "POST",
        "api.shop.test",
        443,
        "/v1/stores/s1/orders",
        {**JSON, "authorization": "Bearer tok"},
        b'{"order": {"title": "t"}}',
    ),
    ("nfd", "POST", "api.shop.test", 443, "/v1/stores/s1/orders", JSON, f'{{"order": {{"title": "{NFD}"}}}}'.encode()),
    ("object", "POST", "api.shop.test", 443, "/v1/stores/s1/orders", JSON, b'{"meta": {"a": [1, 2]}}'),
    ("encoded path", "POST", "api.shop.test", 443, "/v1/stores/%73%31/orders", JSON, b'{"order": {"title": "t"}}'),
    (
        "query and header",
        "POST",
        "API.shop.test.",
        8443,
        "/v1/stores/s1/orders?dry_run=1&token=x",
        {**JSON, "x-tenant": "acme", "cookie": "c=1"},
        b"{}",
    ),
    ("raw body", "POST", "api.shop.test", 443, "/v1/raw", {"content-type": "text/plain"}, b"hello"),
    ("form", "POST", "api.shop.test", 443, "/v1/form", FORM, b"title=a&sku=b&sku=c"),
    ("curl -d", "POST", "api.shop.test", 443, "/v1/form", FORM, b'{"title": "a", "sku": "b"}'),
    ("not json", "POST", "api.shop.test", 443, "/v1/stores/s1/orders", JSON, b"{oops"),
]


OLD_FINGERPRINTS = """
import json, sys
from proxy_addon.fingerprint import RequestView, fingerprint
from proxy_addon.rules import RuleSet, load_rules
rules_text, corpus, key = json.loads(sys.stdin.read())
rules = RuleSet.of([load_rules(rules_text, "t.yaml")])
out = {}
for name, method, host, port, path, headers, body in corpus:
    m = rules.match(host, port, method, path, body.encode("latin-1"))
    view = RequestView(method, "https", host, port, path, headers, body.encode("latin-1"))
    out[name] = fingerprint(m, view, key.encode()).fingerprint if m else None
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def dc97d6d_fingerprints(tmp_path_factory) -> dict[str, str | None]:
    """What dc97d6d's own `fingerprint()` gave for the corpus, run from its package in a subprocess."""
    where = tmp_path_factory.mktemp("dc97d6d")
    with tarfile.open(EARLIER) as t:
        t.extractall(where, filter="data")
    corpus = [(n, m, h, po, pa, hd, b.decode("latin-1")) for n, m, h, po, pa, hd, b in CORPUS]
    p = subprocess.run(
        [sys.executable, "-c", OLD_FINGERPRINTS],
        input=json.dumps([RULES, corpus, KEY.decode()]),
        capture_output=True,
        text=True,
        cwd=where,
        env={"PYTHONPATH": str(where), "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.mark.parametrize("case", CORPUS, ids=[c[0] for c in CORPUS])
def test_scheme_1_is_what_dc97d6d_computed(case, dc97d6d_fingerprints):
    name, method, host, port, path, headers, body = case
    rules = RuleSet.of([load_rules(RULES, "t.yaml")])
    m = rules.match(host, port, method, path, body, headers=list(headers.items()))
    assert m is not None
    ours = fingerprint_v1(
        m, KEY, method=method, scheme="https", host=host, port=port, path=path, headers=headers, sent=body
    )
    assert ours == dc97d6d_fingerprints[name]


def test_most_of_the_corpus_is_read_otherwise_today(dc97d6d_fingerprints):
    """The corpus is worth pinning: scheme 1 and today's differ for these (and agree where nothing changed)."""
    rules = RuleSet.of([load_rules(RULES, "t.yaml")])
    differ = set()
    for name, method, host, port, path, headers, body in CORPUS:
        today = fingerprint(
            match(rules, method, host, port, path, headers, body), view(method, host, port, path, headers, body), KEY
        )
        if today.fingerprint != dc97d6d_fingerprints[name]:
            differ.add(name)
    assert {"bearer", "nfd", "object", "encoded path", "query and header", "curl -d"} <= differ
    assert "raw body" not in differ  # the SHA-256 of a body nothing decodes: the same in both
