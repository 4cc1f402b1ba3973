"""
The tools of GitHub's official MCP server (github/github-mcp-server) that rules/github-mcp.yaml
uses, as the server publishes them in `tools/list`: name, description, input schema (argument
names, types, required) and annotations; and the shapes of their answers. Data only, for a fake
GitHub MCP server in the pack's tests.

Each tool is copied from the repository's snapshot of its `tools/list` entry,
pkg/github/__toolsnaps__/<name>.snap, at the commit named in `source`. The snapshots moved
between commits (the repository holds no single versioned list), so the commits differ; where
the Go source at another commit says otherwise, `note` says so. Long descriptions are kept
verbatim, as a model would see them.

Answers (`SUCCESS`, `ERRORS`): the server's results have one text content item and no
structuredContent (pkg/mcpresult/mcpresult.go @ 5076b51b: NewText, NewError, NewErrorFromErr);
a tool error is a result with isError: true, never a JSON-RPC error. Error texts are
"<what failed>: <err>" (pkg/errors/error.go @ 0a6760d5), and go-github renders a GitHub answer
as "<METHOD> <URL>: <status> <message> <errors>" (google/go-github github/github.go @ 0026dfd9,
ErrorResponse.Error: "%v %v: %d %v %+v").
"""

from __future__ import annotations

from typing import Any

REPO = "github/github-mcp-server"

_PAGE = {"description": "Page number for pagination (min 1)", "minimum": 1, "type": "number"}
_PER_PAGE = {
    "description": "Results per page for pagination (min 1, max 100)",
    "maximum": 100,
    "minimum": 1,
    "type": "number",
}

_SHOW_UI_ISSUE = (
    "Whether to render the MCP App form instead of executing the request immediately. Defaults to true. "
    "Set to false to skip the form and execute directly — useful when you have all required values "
    "(especially ones the form does not collect, like labels, assignees, milestone, type, or state changes) "
    "and the user has already confirmed the action."
)
_SHOW_UI_PR = (
    "Whether to render the MCP App form instead of executing the request immediately. Defaults to true. "
    "Set to false to skip the form and execute directly — useful when you have all required values "
    "(especially ones the form does not collect, like reviewers) and the user has already confirmed the action."
)

TOOLS: dict[str, dict[str, Any]] = {
    # Writes the pack matches.
    "issue_write": {
        "name": "issue_write",
        "description": "Create a new or update an existing issue in a GitHub repository.",
        "annotations": {"title": "Create or update issue/pull request"},  # readOnlyHint false: omitted
        "_meta": {"ui": {"resourceUri": "ui://github-mcp-server/issue-write", "visibility": ["model", "app"]}},
        "inputSchema": {
            "type": "object",
            "properties": {
                "assignees": {
                    "description": "Usernames to assign to this issue",
                    "items": {"description": "GitHub username", "type": "string"},
                    "type": "array",
                },
                "body": {"description": "Issue body; Markdown supported.", "type": "string"},
                "duplicate_of": {
                    "description": "Issue number that this issue is a duplicate of. "
                    "Only used when state_reason is 'duplicate'.",
                    "type": "number",
                },
                "issue_number": {"description": "Issue number to update", "type": "number"},
                "labels": {
                    "description": "Labels to apply to this issue",
                    "items": {"description": "Existing label name", "type": "string"},
                    "type": "array",
                },
                "method": {
                    "description": "Write operation to perform on a single issue.\nOptions are:\n"
                    "- 'create' - creates a new issue.\n- 'update' - updates an existing issue.\n",
                    "enum": ["create", "update"],
                    "type": "string",
                },
                "milestone": {"description": "Milestone number", "type": "number"},
                "owner": {"description": "Repository owner", "type": "string"},
                "repo": {"description": "Repository name", "type": "string"},
                "show_ui": {"description": _SHOW_UI_ISSUE, "type": "boolean"},
                "state": {"description": "New state", "enum": ["open", "closed"], "type": "string"},
                "state_reason": {
                    "description": "Reason for the state change. Ignored unless state is changed.",
                    "enum": ["completed", "not_planned", "duplicate"],
                    "type": "string",
                },
                "title": {"description": "Issue title", "type": "string"},
                "type": {
                    "description": "Type of this issue. Only use if issue types are enabled for this repository. "
                    "Use list_issue_types tool to get valid type values for this repository or its owner "
                    "organization. If the repository doesn't support issue types, omit this parameter.",
                    "type": "string",
                },
            },
            "required": ["method", "owner", "repo"],
        },
        "source": (REPO, "pkg/github/__toolsnaps__/issue_write.snap", "037661eaddf0d5a56601e10a124b7c55c3b2d4fb"),
        "note": "pkg/github/issues.go @ 009bb7b5 adds issue_fields (array) behind a feature flag; show_ui is "
        "stripped from tools/list for clients without MCP App support.",
    },
    "create_issue": {
        "name": "create_issue",
        "description": "Create a new issue in a GitHub repository with a title and optional body.",
        "annotations": {"destructiveHint": True, "openWorldHint": True, "title": "Create Issue"},
        "inputSchema": {
            "type": "object",
            "properties": {
                "body": {"description": "Issue body content (optional)", "type": "string"},
                "owner": {"description": "Repository owner (username or organization)", "type": "string"},
                "repo": {"description": "Repository name", "type": "string"},
                "title": {"description": "Issue title", "type": "string"},
            },
            "required": ["owner", "repo", "title"],
        },
        "source": (REPO, "pkg/github/__toolsnaps__/create_issue.snap", "9d798a0180ff4e75df3a53ac876b946add9f946c"),
        "note": "served only with the issues_granular feature flag; pkg/github/issues_granular.go @ 009bb7b5 "
        "sets destructiveHint false.",
    },
    "add_issue_comment": {
        "name": "add_issue_comment",
        "description": "Add a comment and/or reaction to a specific issue in a GitHub repository. Use this tool with "
        "pull requests as well (in this case pass pull request number as issue_number), but only if user is not "
        "asking specifically to add or react to review comments. At least one of body or reaction is required.",
        "annotations": {"title": "Add comment to issue or pull request"},
        "inputSchema": {
            "type": "object",
            "properties": {
                "body": {"description": "Comment content. Required unless reaction is provided.", "type": "string"},
                "issue_number": {"description": "Issue number to comment on or react to", "type": "number"},
                "owner": {"description": "Repository owner", "type": "string"},
                "reaction": {
                    "description": "Emoji reaction to add. Required unless body is provided.",
                    "enum": ["+1", "-1", "laugh", "confused", "heart", "hooray", "rocket", "eyes"],
                    "type": "string",
                },
                "repo": {"description": "Repository name", "type": "string"},
            },
            "required": ["owner", "repo", "issue_number"],
        },
        "source": (REPO, "pkg/github/__toolsnaps__/add_issue_comment.snap", "009bb7b5c0a062c06aa6a19efd270d2f45bb4a87"),
    },
    "create_pull_request": {
        "name": "create_pull_request",
        "description": "Create a new pull request in a GitHub repository.",
        "annotations": {"title": "Open new pull request"},
        "_meta": {"ui": {"resourceUri": "ui://github-mcp-server/pr-write", "visibility": ["model", "app"]}},
        "inputSchema": {
            "type": "object",
            "properties": {
                "base": {"description": "Base branch name to merge into, e.g. main", "type": "string"},
                "body": {"description": "PR description; Markdown supported", "type": "string"},
                "draft": {"description": "Create as draft PR", "type": "boolean"},
                "head": {"description": "Branch containing changes, or owner:branch for a fork", "type": "string"},
                "maintainer_can_modify": {"description": "Allow maintainer edits", "type": "boolean"},
                "owner": {"description": "Repository owner", "type": "string"},
                "repo": {"description": "Repository name", "type": "string"},
                "reviewers": {
                    "description": "GitHub usernames or ORG/team-slug team reviewers to request reviews from",
                    "items": {"type": "string"},
                    "type": "array",
                },
                "show_ui": {"description": _SHOW_UI_PR, "type": "boolean"},
                "title": {"description": "PR title", "type": "string"},
            },
            "required": ["owner", "repo", "title", "head", "base"],
        },
        "source": (
            REPO,
            "pkg/github/__toolsnaps__/create_pull_request.snap",
            "037661eaddf0d5a56601e10a124b7c55c3b2d4fb",
        ),
    },
    "create_or_update_file": {
        "name": "create_or_update_file",
        "description": "Create or update a single file in a GitHub repository. \nIf updating, you should provide the "
        "SHA of the file you want to update. Use this tool to create or update a file in a GitHub repository "
        "remotely; do not use it for local file operations.\n\nIn order to obtain the SHA of original file version "
        "before updating, use the following git command:\ngit rev-parse HEAD:<path to file>\n\n"
        "SHA MUST be provided for existing file updates.\n",
        "annotations": {"title": "Create or update file"},
        "inputSchema": {
            "type": "object",
            "properties": {
                "branch": {"description": "Branch to create/update the file in", "type": "string"},
                "content": {"description": "Content of the file", "type": "string"},
                "message": {"description": "Commit message", "type": "string"},
                "owner": {"description": "Repository owner (username or organization)", "type": "string"},
                "path": {"description": "Path where to create/update the file", "type": "string"},
                "repo": {"description": "Repository name", "type": "string"},
                "sha": {
                    "description": "The blob SHA of the file being replaced. Required if the file already exists.",
                    "type": "string",
                },
            },
            "required": ["owner", "repo", "path", "content", "message", "branch"],
        },
        "source": (
            REPO,
            "pkg/github/__toolsnaps__/create_or_update_file.snap",
            "1a50053856b3908b5015916f5cc2f2d3b9d2a211",
        ),
        "note": "pkg/github/repositories.go @ 803f9803: a stale sha → tool error 'SHA mismatch: ...' without "
        "writing; no sha on an existing file → fetches the sha and overwrites, text 'Warning: File updated "
        "without SHA validation...' followed by the JSON.",
    },
    # Reads the pack's reconcile calls.
    "list_issues": {
        "name": "list_issues",
        "description": "List issues in a GitHub repository. For pagination, use the 'endCursor' from the previous "
        "response's 'pageInfo' in the 'after' parameter.",
        "annotations": {"idempotentHint": False, "readOnlyHint": True, "title": "List issues"},
        "inputSchema": {
            "type": "object",
            "properties": {
                "after": {
                    "description": "Cursor for pagination. Use the cursor from the previous response.",
                    "type": "string",
                },
                "direction": {
                    "description": "Order direction. If provided, the 'orderBy' also needs to be provided.",
                    "enum": ["ASC", "DESC"],
                    "type": "string",
                },
                "labels": {"description": "Filter by labels", "items": {"type": "string"}, "type": "array"},
                "orderBy": {
                    "description": "Order issues by field. If provided, the 'direction' also needs to be provided.",
                    "enum": ["CREATED_AT", "UPDATED_AT", "COMMENTS"],
                    "type": "string",
                },
                "owner": {"description": "Repository owner", "type": "string"},
                "perPage": _PER_PAGE,
                "repo": {"description": "Repository name", "type": "string"},
                "since": {"description": "Filter by date (ISO 8601 timestamp)", "type": "string"},
                "state": {
                    "description": "Filter by state, by default both open and closed issues are returned "
                    "when not provided",
                    "enum": ["OPEN", "CLOSED"],
                    "type": "string",
                },
            },
            "required": ["owner", "repo"],
        },
        "source": (REPO, "pkg/github/__toolsnaps__/list_issues.snap", "11d7e25f36398a6eb455158846c4a7985d5c757a"),
        "note": "the snapshot also lists `fields` (enum of result fields) and `field_filters` (custom issue "
        "fields), left out here: the pack sends neither.",
    },
    "issue_read": {
        "name": "issue_read",
        "description": "Get information about a specific issue in a GitHub repository.",
        "annotations": {"idempotentHint": False, "readOnlyHint": True, "title": "Get issue details"},
        "inputSchema": {
            "type": "object",
            "properties": {
                "issue_number": {"description": "The number of the issue", "type": "number"},
                "method": {
                    "description": "The read operation to perform on a single issue.",  # shortened
                    "enum": ["get", "get_comments", "get_sub_issues", "get_parent", "get_labels"],
                    "type": "string",
                },
                "owner": {"description": "The owner of the repository", "type": "string"},
                "page": _PAGE,
                "perPage": _PER_PAGE,
                "repo": {"description": "The name of the repository", "type": "string"},
            },
            "required": ["method", "owner", "repo", "issue_number"],
        },
        "source": (REPO, "pkg/github/__toolsnaps__/issue_read.snap", "1a433e82f7f249f7f49a5d52d2488e3bd886329f"),
        "note": "pkg/github/issues.go @ 009bb7b5 has no get_parent in the enum.",
    },
    "list_pull_requests": {
        "name": "list_pull_requests",
        "description": "List pull requests in a GitHub repository. If the user specifies an author, then DO NOT use "
        "this tool and use the search_pull_requests tool instead.",
        "annotations": {"idempotentHint": False, "readOnlyHint": True, "title": "List pull requests"},
        "inputSchema": {
            "type": "object",
            "properties": {
                "base": {"description": "Filter by base branch", "type": "string"},
                "direction": {"description": "Sort direction", "enum": ["asc", "desc"], "type": "string"},
                "head": {"description": "Filter by head user/org and branch", "type": "string"},
                "owner": {"description": "Repository owner", "type": "string"},
                "page": _PAGE,
                "perPage": _PER_PAGE,
                "repo": {"description": "Repository name", "type": "string"},
                "sort": {
                    "description": "Sort by",
                    "enum": ["created", "updated", "popularity", "long-running"],
                    "type": "string",
                },
                "state": {"description": "Filter by state", "enum": ["open", "closed", "all"], "type": "string"},
            },
            "required": ["owner", "repo"],
        },
        "source": (
            REPO,
            "pkg/github/__toolsnaps__/list_pull_requests.snap",
            "21f00ba30dc23e053884ce7067ed484599117726",
        ),
        "note": "the snapshot also lists `fields` and an outputSchema (a list of MinimalPullRequest), left out here.",
    },
}

# What a successful call answers: the text of its single text content item (JSON).
# pkg/github/issues.go, pullrequests.go @ 009bb7b5; minimal_types.go @ 021e60e8.
SUCCESS: dict[str, Any] = {
    # MinimalResponse: the database id as a string, and the html_url.
    "issue_write": {"id": "1000042", "url": "https://github.com/octo/hello/issues/42"},
    "create_issue": {"id": "1000042", "url": "https://github.com/octo/hello/issues/42"},
    "add_issue_comment": {"id": "2000007", "url": "https://github.com/octo/hello/issues/42#issuecomment-2000007"},
    "create_pull_request": {"id": "3000005", "url": "https://github.com/octo/hello/pull/5"},
    # The contents API's answer, marshalled (repositories.go @ 803f9803).
    "create_or_update_file": {
        "content": {
            "name": "a.txt",
            "path": "docs/a.txt",
            "sha": "b" * 40,
            "html_url": "https://github.com/octo/hello/blob/main/docs/a.txt",
        },
        "commit": {"sha": "c" * 40, "html_url": "https://github.com/octo/hello/commit/" + "c" * 40},
    },
    # MinimalIssuesResponse (GraphQL; no id, no url on an issue).
    "list_issues": {
        "issues": [
            {
                "number": 42,
                "title": "Build broke",
                "body": "on main",
                "state": "OPEN",
                "user": {"login": "octo-bot"},
                "comments": 0,
                "created_at": "2026-11-30T10:00:00Z",
                "updated_at": "2026-11-30T10:00:00Z",
            }
        ],
        "totalCount": 1,
        "pageInfo": {
            "hasNextPage": False,
            "hasPreviousPage": False,
            "startCursor": "Y3Vyc29yOjE=",
            "endCursor": "Y3Vyc29yOjE=",
        },
    },
    # issue_read get_comments: a list of MinimalIssueComment.
    "issue_read:get_comments": [
        {
            "id": 2000007,
            "body": "Fixed in #5",
            "html_url": "https://github.com/octo/hello/issues/42#issuecomment-2000007",
            "user": {"login": "octo-bot"},
            "created_at": "2026-11-30T10:05:00Z",
        }
    ],
    # A list of MinimalPullRequest.
    "list_pull_requests": [
        {
            "number": 5,
            "title": "Fix the build",
            "state": "open",
            "draft": False,
            "merged": False,
            "html_url": "https://github.com/octo/hello/pull/5",
            "head": {"ref": "fix-build", "sha": "d" * 40},
            "base": {"ref": "main", "sha": "e" * 40},
        }
    ],
}

# Tool errors (isError: true, this one text), by what they prove. The frame of each text is the
# source's (prefix, go-github's "METHOD URL: status message errors"); GitHub's own messages inside
# are illustrative, except "A pull request already exists for" (see rules/github.yaml).
_API = "https://api.github.com/repos/octo/hello"

ERRORS: dict[str, str] = {
    # GitHub refused before acting (4xx).
    "issue_422": "failed to create issue: POST " + _API + "/issues: 422 Validation Failed "
    "[{Resource:Issue Field:title Code:missing_field Message:}]",
    "issue_410": "failed to create issue: POST " + _API + "/issues: 410 Issues are disabled for this repo []",
    "comment_404": "failed to create comment: POST " + _API + "/issues/42/comments: 404 Not Found []",
    "pr_no_commits": "failed to create pull request: POST " + _API + "/pulls: 422 Validation Failed "
    "[{Resource:PullRequest Field: Code:custom Message:No commits between main and fix-build}]",
    # The server refused before calling GitHub.
    "missing_title": "missing required parameter: title",
    "issue_form": "An interactive form has been shown to the user for creating a new issue in octo/hello. "
    "STOP — do not call any other tools, do not respond as if the issue was created, "
    "and do not claim the operation succeeded. The "
    "issue has NOT been created yet; only the form was rendered. Wait silently for the user to review and click "
    "Submit. When they do, the real result will be delivered to your context automatically.",
    # Evidence the effect may exist.
    "pr_exists": "failed to create pull request: POST " + _API + "/pulls: 422 Validation Failed "
    "[{Resource:PullRequest Field: Code:custom Message:A pull request already exists for octo:fix-build.}]",
    "pr_reviewers": "failed to request reviewers: POST " + _API + "/pulls/5/requested_reviewers: "
    "422 Reviews may only be requested from collaborators. []",
    "file_sha_stale": "SHA mismatch: provided SHA " + "a" * 40 + " is stale. Current file SHA is " + "b" * 40 + ". "
    "Use get_file_contents or compare commits to review changes before updating.",
    # Maybe executed.
    "issue_502": "failed to create issue: POST " + _API + "/issues: 502 Server Error []",
    "issue_timeout": 'failed to create issue: Post "' + _API + '/issues": context deadline exceeded',
}

__all__ = ["ERRORS", "REPO", "SUCCESS", "TOOLS"]
