"""The version of an operation's rules an approval binds to (rules/policy_version.py)."""

from __future__ import annotations

from proxy_addon.rules import load_rules
from proxy_addon.rules.policy_version import policy_version

BASE = """\
api: shop
hosts: [api.shop.test]
operations:
  refunds.create:
    match: {method: POST, path: /v1/refunds}
    fingerprint: {body: [amount, charge]}
    approve: true
"""


def version(text: str) -> str:
    (op,) = load_rules(text, "shop.yaml").operations
    return policy_version(op)


def test_the_same_rule_has_the_same_version_wherever_it_sits_in_its_file():
    assert version(BASE) == version(BASE) and version(BASE).startswith("p1:")
    assert version(BASE) == version("# a comment moves every line\n\n" + BASE)
    described = BASE.replace("    approve: true\n", "    approve: true\n    description: refunds over the limit\n")
    assert version(BASE) == version(described)


def test_what_decides_changes_the_version():
    decided = BASE.replace("    approve: true\n", "    decisions:\n      - approve: {amount: {'>=': 100000}}\n")
    lower = decided.replace("100000", "50000")
    others = [
        BASE.replace("approve: true", "approve: false"),
        BASE.replace("[amount, charge]", "[amount]"),
        BASE.replace("/v1/refunds", "/v2/refunds"),
        decided,
        lower,
    ]
    versions = {version(BASE), *(version(t) for t in others)}
    assert len(versions) == len(others) + 1
