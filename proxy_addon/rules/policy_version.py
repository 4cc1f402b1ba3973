"""
The version of an operation's rules that an approval binds to: `policy_version(op)`.

A digest of what decides whether a write is held and what it is: the operation's method and
path, what its fingerprint reads (`Operation.fingerprint_rule`, the receipt's rule digest),
`approve` and its `decisions:`. An approval is given under one version; the write it releases
must still be held under that version when the approval is applied (mitm/approval.py), so an
edit of the rules while a write waits (a lower threshold, another field) voids the approval
given before it. Where the rule sits in its file (line numbers), its description and what
answers look like are not part of it: moving a rule does not void an approval.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from proxy_addon.rules.model import DecisionRule, Operation


def _plain(value: Any) -> Any:
    """A condition's value as JSON: a compiled pattern by its text."""
    if isinstance(value, re.Pattern):
        return value.pattern
    if isinstance(value, (list, tuple, frozenset, set)):
        return [_plain(v) for v in value]
    return value


def _decision(rule: DecisionRule) -> dict[str, Any]:
    return {
        "decision": rule.decision,
        "conditions": [[c.field, c.op, _plain(c.value)] for c in rule.conditions],
    }


def policy_version(op: Operation) -> str:
    """`p1:` and 16 hex digits: equal for two loads of the same rule, different when what decides changes."""
    described = {
        "api": op.api,
        "operation": op.name,
        "method": op.method,
        "path": [t.template for t in op.path.alternatives] or op.path.template,
        "fingerprint": op.fingerprint_rule(),
        "approve": op.approve,
        "decisions": [_decision(d) for d in op.decisions],
    }
    text = json.dumps(described, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return "p1:" + hashlib.sha256(text.encode()).hexdigest()[:16]
