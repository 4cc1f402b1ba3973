"""
Hostile rules files: `load_rules` either returns a RuleFile or raises RulesError naming the file;
nothing else escapes it (a hypothesis property over random and mutated YAML). Bodies the fingerprint
cannot read as fields, through a real proxy: tests/e2e/proxy/test_bad_input.py.
"""

from __future__ import annotations

import copy

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy_addon.errors import RulesError
from proxy_addon.rules import RuleFile, load_rules
from tests.conftest import ROOT

DEV_TO = (ROOT / "rules" / "dev.to.yaml").read_text()


TEST_API = (ROOT / "tests" / "rules_it" / "test-api.yaml").read_text()


RULE_WORDS = [
    "api",
    "hosts",
    "credentials",
    "operations",
    "header",
    "env",
    "description",
    "match",
    "method",
    "path",
    "fingerprint",
    "body",
    "query",
    "headers",
    "external_id",
    "after_success",
    "classify",
    "reconcile",
    "read",
    "url",
    "find",
    "items",
    "absence_provable",
    "retry_when_absent",
    "idempotency_key",
    "replay",
    "block",
    "allow",
    "POST",
    "get",
    "/api/things",
    "/api/{id}",
    "/api/{id",
    "{intent.title}",
    "id",
    "title",
    "dev.to",
    "*.example.com",
    "host:8443",
    "api-key",
    "Authorization",
    "4xx",
    "409",
    "succeeded",
    "rejected",
    "outcome_unknown",
    "data.id",
    "items.0.sku",
    "true",
    "no",
]


_words = st.sampled_from(RULE_WORDS)


_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12) | _words


_keys = _words | st.text(max_size=8) | st.integers(-5, 500) | st.none() | st.booleans()


_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=5),
    max_leaves=25,
)


# Documents shaped like a rules file, so that the fuzz reaches operations, not only the top level.
_rule_like = st.fixed_dictionaries(
    {"api": _scalars, "hosts": _values, "operations": st.dictionaries(_keys, _values, max_size=3)},
    optional={"credentials": _values},
)


def _dump(doc) -> str:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


def _locations(doc):
    """Every (container, key) pair in a parsed document, depth first."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield doc, k
            yield from _locations(v)
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield doc, i
            yield from _locations(v)


@st.composite
def _mutated_docs(draw) -> str:
    """A reference rules file with keys dropped, renamed (to known or random names) or retyped."""
    doc = copy.deepcopy(yaml.safe_load(draw(st.sampled_from([DEV_TO, TEST_API]))))
    for _ in range(draw(st.integers(1, 4))):
        spots = list(_locations(doc))
        if not spots:
            break
        container, key = draw(st.sampled_from(spots))
        action = draw(st.sampled_from(["drop", "retype", "rename"]))
        if action == "drop":
            del container[key]
        elif action == "retype":
            container[key] = draw(_values)
        elif isinstance(container, dict):
            value = container.pop(key)
            container[draw(_keys)] = value
    return _dump(doc)


_YAML_NOISE = st.sampled_from(
    [*":{}[],-#&*!|>'\"%@`?\\\t\n ", "\r", "\x00", "\ufeff", "\u2028", "{{", "&a ", "*a", "!!str ", "!!map "]
)


@st.composite
def _mutated_text(draw) -> str:
    """A reference rules file (comments and all) with lines duplicated or dropped and characters inserted."""
    text = draw(st.sampled_from([DEV_TO, TEST_API]) | _mutated_docs())
    for _ in range(draw(st.integers(1, 6))):
        action = draw(st.sampled_from(["dup_line", "drop_line", "insert", "insert"]))
        lines = text.splitlines(keepends=True)
        if action in ("dup_line", "drop_line") and lines:
            i = draw(st.integers(0, len(lines) - 1))
            lines[i : i + 1] = [lines[i]] * (2 if action == "dup_line" else 0)
            text = "".join(lines)
        else:
            pos = draw(st.integers(0, len(text)))
            chunk = draw(st.lists(_YAML_NOISE | st.characters(), min_size=1, max_size=4).map("".join))
            text = text[:pos] + chunk + text[pos:]
    return text


_yaml_tokens = st.lists(
    _YAML_NOISE
    | _words
    | st.sampled_from(
        [
            "api: ",
            "hosts: ",
            "operations:\n",
            "  ",
            "- ",
            "---\n",
            "...\n",
            "%YAML 1.1\n",
            "<<: *a\n",
            "? ",
            "!!binary ",
            "!custom ",
        ]
    ),
    max_size=40,
).map("".join)


RULES_TEXTS = (
    _values.map(_dump)
    | _rule_like.map(_dump)
    | st.text(max_size=200)
    | st.text(st.characters(codec=None, exclude_categories=()), max_size=60)  # surrogates, controls
    | _yaml_tokens
    | _mutated_docs()
    | _mutated_text()
)


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=RULES_TEXTS)
def test_any_rules_text_loads_or_raises_rules_error(text):
    try:
        rf = load_rules(text, "fuzz.yaml")
    except RulesError as e:
        assert str(e).startswith("fuzz.yaml"), str(e)
        assert e.source == "fuzz.yaml"
    else:
        assert isinstance(rf, RuleFile)
        assert rf.source == "fuzz.yaml"
        assert rf.api and rf.hosts and rf.operations  # what load_rules promises to require


def test_the_reference_rules_files_load():
    """The fuzz starts from these: they must load as they are, or the mutations prove little."""
    assert [op.name for op in load_rules(DEV_TO, "fuzz.yaml").operations] == ["articles.create", "articles.update"]
    assert len(load_rules(TEST_API, "fuzz.yaml").operations) == 12  # tests/rules_it/test-api.yaml


_RULES_HEAD = "api: x\nhosts: [example.com]\ncredentials: {header: api-key}\noperations:\n  things.create:\n"


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("[" * 600 + "]" * 600, id="nested-flow-lists"),
        pytest.param("a:\n" + "".join(" " * i + "b:\n" for i in range(1, 600)), id="nested-block-mappings"),
        pytest.param(_RULES_HEAD + '    match: {method: POST, path: "/api/{id\\n}"}\n', id="newline-in-path-parameter"),
        pytest.param("&a [*a]", id="self-referencing-alias"),
        pytest.param("!!python/object:os.system ls", id="python-tag"),
        pytest.param("\ufeff\x00", id="nul"),
        pytest.param("a: \ud800", id="lone-surrogate"),
    ],
)
def test_hostile_rules_text_is_a_rules_error(text):
    with pytest.raises(RulesError) as e:
        load_rules(text, "fuzz.yaml")
    assert str(e.value).startswith("fuzz.yaml")


_OPERATION = "    match: {method: POST, path: /api/things}\n"


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(_RULES_HEAD.replace("[example.com]", '["example.com\\n"]') + _OPERATION, id="host"),
        pytest.param(
            _RULES_HEAD.replace("{header: api-key}", '{header: "api-key\\n"}') + _OPERATION, id="credentials-header"
        ),
        pytest.param(_RULES_HEAD.replace("things.create:", '"things.create\\n":') + _OPERATION, id="operation-name"),
        pytest.param(_RULES_HEAD + _OPERATION + '    classify: {"409\\n": rejected}\n', id="classify-status"),
        pytest.param(
            _RULES_HEAD + _OPERATION + '    idempotency_key: {header: "Idempotency-Key\\n"}\n', id="idempotency-header"
        ),
    ],
)
def test_a_trailing_newline_in_a_name_is_refused(text):
    assert "\\n" in text  # a YAML escape: the loaded name ends with a newline
    with pytest.raises(RulesError) as e:
        load_rules(text, "fuzz.yaml")
    assert str(e.value).startswith("fuzz.yaml")
