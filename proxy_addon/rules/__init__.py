"""
Rules: which requests are mutating operations, and what identifies their intent.

One YAML file per API. `load_rules(text, source)` is pure: it knows nothing of
mitmproxy and raises `RulesError` naming the file, the line and the field.
`load_rules_path(path)` reads a file or every `*.yaml`/`*.yml` in a folder.

    api: dev.to
    hosts: [dev.to]
    credentials: {header: api-key}
    operations:
      articles.create:
        match: {method: POST, path: /api/articles}
        fingerprint: {body: [article.title, article.body_markdown]}
        external_id: id

model.py holds what a file loads into; ruleset.py the matching; loader.py reads files and folders,
with nodes.py (strict YAML values), load_operation.py, load_classify.py, load_reconcile.py and
error_templates.py (an `errors:` template);
placeholders.py names the `YOUR-…` values left in a file, todo_comments.py its `# TODO:` comments (warnings,
not errors).
"""

from proxy_addon.rules.loader import (
    check_rules,
    check_rules_path,
    load_rules,
    load_rules_path,
    rules_files,
    rules_signature,
)
from proxy_addon.rules.model import (
    AFTER_SUCCESS,
    ALREADY_EXISTS,
    ANY_TOOL,
    CLASSIFIABLE,
    FROM_SERVER,
    KEYS,
    METHODS,
    TEMPLATE_VAR,
    AfterSuccess,
    Check,
    ClassifyRule,
    FingerprintSpec,
    Match,
    Operation,
    PathTemplate,
    ReconcileSpec,
    RuleFile,
    parse_path_template,
    read_variables,
    template_variables,
)
from proxy_addon.rules.ruleset import RuleSet, host_pattern

__all__ = [
    "AFTER_SUCCESS",
    "ALREADY_EXISTS",
    "ANY_TOOL",
    "CLASSIFIABLE",
    "FROM_SERVER",
    "KEYS",
    "METHODS",
    "TEMPLATE_VAR",
    "AfterSuccess",
    "Check",
    "ClassifyRule",
    "FingerprintSpec",
    "Match",
    "Operation",
    "PathTemplate",
    "ReconcileSpec",
    "RuleFile",
    "RuleSet",
    "check_rules",
    "check_rules_path",
    "host_pattern",
    "load_rules",
    "load_rules_path",
    "parse_path_template",
    "read_variables",
    "rules_files",
    "rules_signature",
    "template_variables",
]
