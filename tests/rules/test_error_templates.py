"""
An error template (`errors: {template: ..., key: ...}`, proxy_addon/rules/error_templates.py): its
placeholders and escapes, loading it into the Operation as canonical JSON text (frozen, hashable),
and every bad template refused by `rules check` with its file, line and field.
"""

from __future__ import annotations

import json

import pytest

from proxy_addon.errors import RulesError
from proxy_addon.rules import check_rules, load_rules
from proxy_addon.rules.error_templates import ERROR_FIELDS, is_template, parsed, pieces


def rules_with(errors: str) -> str:
    """A rules file whose `errors:` is `errors` (YAML lines, indented two spaces)."""
    return f"""api: demo
hosts: [api.demo.test]
errors:
{errors}
operations:
  things.create:
    match: {{method: POST, path: /things}}
"""


# --- the syntax ---


def test_pieces_split_text_and_placeholders():
    assert pieces("{code}: {message}") == (("code", True), (": ", False), ("message", True))
    assert pieces("{status}") == (("status", True),)
    assert pieces("no placeholder") == (("no placeholder", False),)
    assert pieces("") == ()


def test_doubled_braces_are_a_literal_brace():
    assert pieces("{{code}}") == (("{code}", False),)
    assert pieces("{{{code}}}") == (("{", False), ("code", True), ("}", False))
    assert pieces("a {{ b }} c") == (("a { b } c", False),)


@pytest.mark.parametrize(
    "text, message",
    [
        ("{receipt_id}", "{receipt_id} is not a placeholder of an error template"),
        ("{}", "{} is not a placeholder"),
        ("{code!r}", "{code!r} is not a placeholder"),  # no conversions, no format specs
        ("{code:>5}", "{code:>5} is not a placeholder"),
        ("{ code }", "{ code } is not a placeholder"),
        ("x { y", "a lone '{'"),
        ("x } y", "a lone '}'"),
        ("{code}}", "a lone '}'"),
    ],
)
def test_bad_strings(text, message):
    with pytest.raises(ValueError) as info:
        pieces(text)
    assert message in str(info.value)


# --- loading ---


def test_a_template_loads_into_the_operation_as_canonical_text():
    rf = load_rules(
        rules_with(
            '  template: {status: error, error: {code: "{code}", text: "{message}", http: "{status}"}}\n'
            "  key: details.receipt_proxy"
        )
    )
    (op,) = rf.operations
    assert is_template(op.errors)
    hash(op)  # still frozen and hashable
    template, key = parsed(op.errors)
    assert template == {"status": "error", "error": {"code": "{code}", "text": "{message}", "http": "{status}"}}
    assert list(template) == ["status", "error"]  # the author's order, kept
    assert key == ("details", "receipt_proxy")
    assert json.loads(op.errors) == {"key": ["details", "receipt_proxy"], "template": template}


def test_the_key_defaults_to_receipt_proxy_at_the_top():
    (op,) = load_rules(rules_with('  template: {message: "{message}"}')).operations
    assert parsed(op.errors)[1] == ("receipt_proxy",)


def test_json_scalars_keep_their_types():
    (op,) = load_rules(rules_with("  template: {ok: false, n: 3, x: 1.5, none: null, list: [1, two]}")).operations
    assert parsed(op.errors)[0] == {"ok": False, "n": 3, "x": 1.5, "none": None, "list": [1, "two"]}


def test_named_envelopes_load_as_before():
    for name in ("plain", "openai", "anthropic", "stripe", "github"):
        (op,) = load_rules(rules_with(f"  {name}").replace("errors:\n ", "errors:")).operations
        assert op.errors == name and not is_template(op.errors)


BAD = [
    # (errors: lines, line, field, piece of the message)
    ('  template: {error: "{receipt}"}', 4, "errors.template.error", "{receipt} is not a placeholder"),
    ('  template: {error: {text: "half { a brace"}}', 4, "errors.template.error.text", "a lone '{'"),
    ('  template: {list: [ok, "{nope}"]}', 4, "errors.template.list[1]", "{nope} is not a placeholder"),
    ('  template: {"{code}": x}', 4, "errors.template.{code}", "a key is taken as written"),
    ("  template: {when: 2024-01-01}", 4, "errors.template.when", "expected a JSON value"),
    ("  template: {n: .nan}", 4, "errors.template.n", "expected a JSON value"),
    ("  template: [a, b]", 4, "errors.template", "expected a mapping (the envelope's JSON object), got a list"),
    ("  template: error", 4, "errors.template", "expected a mapping"),
    ("  key: x", 4, "errors.template", "is required"),
    ("  template: {a: 1}\n  extra: 2", 5, "errors.extra", "unknown key 'extra'; expected one of: template, key"),
    ("  template: {a: 1}\n  key: a", 5, "errors.key", "the template already has a"),
    ("  template: {a: 1}\n  key: a.b", 5, "errors.key", "the template's a is not a mapping"),
    ("  template: {a: {b: 1}}\n  key: a.b", 5, "errors.key", "the template already has a.b"),
    ("  template: {receipt_proxy: x}", 4, "errors.key", "the template already has receipt_proxy"),
    ("  template: {a: 1}\n  key: a..b", 5, "errors.key", "is not a dotted key"),
    ("  template: {a: 1}\n  key: 3", 5, "errors.key", "expected a non-empty string"),
    ("  template: {a: 1, a: 2}", 4, "errors.template.a", "duplicate key"),
    ("  - openai", 4, "errors", "expected one of plain, openai, anthropic, stripe, github, or a template"),
]


@pytest.mark.parametrize("errors, line, field, message", BAD, ids=[b[3][:40] for b in BAD])
def test_bad_templates_name_file_line_and_field(errors, line, field, message):
    problems = check_rules(rules_with(errors), "demo.yaml")
    assert problems, errors
    p = problems[0]
    assert (p.source, p.line, p.field) == ("demo.yaml", line, field), str(p)
    assert message in p.message, str(p)
    with pytest.raises(RulesError):
        load_rules(rules_with(errors), "demo.yaml")


def test_every_bad_part_of_a_template_is_reported_in_one_run():
    text = rules_with('  template:\n    a: "{one}"\n    b: ["{two}", ok]\n    c: {d: "{three}"}')
    problems = check_rules(text, "demo.yaml")
    assert [(p.line, p.field) for p in problems] == [
        (5, "errors.template.a"),
        (6, "errors.template.b[0]"),
        (7, "errors.template.c.d"),
    ]


def test_a_template_nested_too_deep_is_refused():
    deep = "{a: " * 20 + "x" + "}" * 20
    (p,) = check_rules(rules_with(f"  template: {deep}"), "demo.yaml")
    assert "nested deeper than" in p.message


def test_the_placeholders_are_the_documented_ones():
    assert ERROR_FIELDS == ("code", "message", "status", "operation_id", "state")
