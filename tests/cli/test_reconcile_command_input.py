"""`receipts reconcile`: the credentials it sends, and the arguments it refuses before any read or write."""

from __future__ import annotations

import pytest

from proxy_addon.cli import main
from proxy_addon.states import State
from tests.cli.conftest import KEY_ENV, UNKNOWN_ID, Recon, assert_one_line_error, dump

SECRET_HEADER = "SECRET-HEADER-9d1c44"
SECRET_ENV = "SECRET-ENV-7ab302"


@pytest.mark.parametrize(
    "argv, env, sent",
    [
        pytest.param([], None, {}, id="none"),
        pytest.param(["--header", f"api-key: {SECRET_HEADER}"], None, {"api-key": SECRET_HEADER}, id="header"),
        pytest.param(
            ["--header", f"  API-Key :  {SECRET_HEADER}  "],
            None,
            {"api-key": SECRET_HEADER},
            id="header-name-case-and-spaces",
        ),
        pytest.param(
            ["--header", f"api-key: {SECRET_HEADER}", "--header", "Authorization: Bearer SECRET-BEARER-1"],
            None,
            {"api-key": SECRET_HEADER, "authorization": "Bearer SECRET-BEARER-1"},
            id="two-headers",
        ),
        pytest.param([], SECRET_ENV, {"api-key": SECRET_ENV}, id="env-named-by-credentials.env"),
        pytest.param(
            ["--header", f"api-key: {SECRET_HEADER}"], SECRET_ENV, {"api-key": SECRET_HEADER}, id="header-beats-env"
        ),
        pytest.param(
            ["--header", "Authorization: Bearer SECRET-BEARER-1"],
            SECRET_ENV,
            {"authorization": "Bearer SECRET-BEARER-1"},
            id="any-header-replaces-env",
        ),
        pytest.param([], "", {}, id="empty-env"),
    ],
)
def test_reconcile_credentials_are_sent_and_never_stored(recon, capsys, monkeypatch, argv, env, sent):
    if env is not None:
        monkeypatch.setenv(KEY_ENV, env)
    recon.add("things", "x")
    rid = recon.receipt("x")
    code, out, err = recon.run(capsys, rid, *argv)
    assert (code, err) == (0, "")
    assert recon.store.get(rid).state == "succeeded"
    [read] = recon.gets()
    headers = {k.lower(): v for k, v in read["headers"].items()}
    assert {k: headers[k] for k in ("api-key", "authorization") if k in headers} == sent
    stored = recon.db_bytes()
    assert b"test-api" in stored and rid.encode() in stored  # the bytes read are the database's
    for secret in ("SECRET-", SECRET_HEADER, SECRET_ENV):
        assert secret.encode() not in stored
        assert secret not in out
    assert (SECRET_ENV in headers.values()) == (SECRET_ENV in sent.values())


RECONCILE_ERRORS = [
    pytest.param(["{unknown}"], ["{unknown}"], id="unknown-id"),
    pytest.param(["{outcome_unknown}", "{unknown}"], ["{unknown}"], id="a-known-and-an-unknown-id"),
    pytest.param([], ["--all"], id="neither-ids-nor-all"),
    pytest.param(["{outcome_unknown}", "--all"], ["--all"], id="ids-and-all"),
    pytest.param(["{outcome_unknown}", "--header", "nocolon"], ["--header", "'nocolon'"], id="header-without-colon"),
    pytest.param(["{outcome_unknown}", "--header", " : v"], ["--header"], id="header-without-name"),
    pytest.param(
        ["{outcome_unknown}", "--header", "api-key: v", "--header", "nocolon"], ["'nocolon'"], id="second-header-bad"
    ),
    pytest.param(["--all", "--header", "nocolon"], ["'nocolon'"], id="bad-header-with-all"),
    pytest.param(["{outcome_unknown}", "--header", "api key: v"], ["--header", "api key"], id="header-name-with-space"),
    pytest.param(
        ["{outcome_unknown}", "--rules", "{tmp}/missing.yaml"],
        ["--rules", "missing.yaml", "no such rules"],
        id="missing-rules-file",
    ),
    pytest.param(
        ["--all", "--rules", "{tmp}/no-rules-here"],
        ["--rules", "no-rules-here", "no *.yaml"],
        id="rules-folder-without-yaml",
    ),
    pytest.param(
        ["{outcome_unknown}", "--rules", "{tmp}/broken.yaml"], ["--rules", "broken.yaml"], id="malformed-rules-file"
    ),
    pytest.param(["{succeeded}"], ["{succeeded}", "is succeeded"], id="already-succeeded"),
    pytest.param(["{rejected}"], ["{rejected}", "is rejected"], id="already-rejected"),
    pytest.param(["{safe_to_retry}"], ["{safe_to_retry}", "is safe_to_retry"], id="already-safe_to_retry"),
    pytest.param(["{submitted}"], ["{submitted}", "is submitted"], id="still-submitted"),
    pytest.param(["{reconciling}"], ["{reconciling}", "is reconciling"], id="being-reconciled"),
]


@pytest.mark.parametrize("argv, needles", RECONCILE_ERRORS)
def test_reconcile_errors_write_nothing_and_read_nothing(recon, capsys, tmp_path, argv, needles):
    (tmp_path / "no-rules-here").mkdir()
    (tmp_path / "broken.yaml").write_text("api: test-api\nhosts: [127.0.0.1]\noperations: {x: {match: 3}}\n")
    ids = {str(s): recon.receipt(str(s), state=s) for s in State}
    values = {**ids, "unknown": UNKNOWN_ID, "tmp": str(tmp_path)}
    before = dump(recon.path)
    code, out, err = recon.run(capsys, *(a.format(**values) for a in argv))
    assert_one_line_error(code, out, err, *(n.format(**values) for n in needles))
    assert dump(recon.path) == before
    assert recon.gets() == []


def test_reconcile_usage_errors(recon, capsys):
    rid = recon.receipt("x")
    before = dump(recon.path)
    for argv, message in [
        (["--timeout", "soon"], "argument --timeout: "),
        (["--header"], "argument --header: expected one argument"),
    ]:
        with pytest.raises(SystemExit) as e:
            main(["--db", str(recon.path), "reconcile", rid, *argv])
        assert e.value.code == 2
        assert message in capsys.readouterr().err
    assert dump(recon.path) == before
    assert recon.gets() == []


# Values that once reached httpx unchecked (a traceback after the claim, or a credential in the DB).


def run_expecting_refusal(recon: Recon, capsys, *argv: str) -> tuple[int, str, str]:
    """Run reconcile; an argparse refusal (exit 2) or an `Error:` line (exit 1) are both a refusal."""
    try:
        return recon.run(capsys, *argv)
    except SystemExit as e:
        out, err = capsys.readouterr()
        assert isinstance(e.code, int), e.code
        return e.code, out, err


@pytest.mark.parametrize("timeout", ["-1", "nan", "inf", "0"])
def test_reconcile_bad_timeout_is_refused_before_any_read(recon, capsys, timeout):
    recon.add("things", "x")
    rid = recon.receipt("x")
    before = dump(recon.path)
    code, out, err = run_expecting_refusal(recon, capsys, rid, f"--timeout={timeout}")
    assert code in (1, 2) and out == "" and "--timeout" in err
    assert dump(recon.path) == before
    assert recon.store.get(rid).state == "outcome_unknown"
    assert recon.gets() == []


@pytest.mark.parametrize(
    "argv, env",
    [
        pytest.param(["--header", "api-key: SECRET-caf\u00e9"], None, id="header"),
        pytest.param([], "SECRET-caf\u00e9", id="env"),
    ],
)
def test_reconcile_unsendable_credential_is_a_one_line_error(recon, capsys, monkeypatch, argv, env):
    if env is not None:
        monkeypatch.setenv(KEY_ENV, env)
    rid = recon.receipt("x")
    before = dump(recon.path)
    code, out, err = recon.run(capsys, rid, *argv)
    assert_one_line_error(code, out, err)
    assert "SECRET-" not in err
    assert dump(recon.path) == before
    assert recon.gets() == []


@pytest.mark.parametrize(
    "argv, env",
    [
        pytest.param([], "SECRET-CR-3f9a\r", id="env-with-a-trailing-CR"),
        pytest.param(["--header", "api-key: SECRET-LF-1\nSECRET-LF-2"], None, id="header-with-a-line-break"),
    ],
)
def test_reconcile_credential_with_a_line_break_never_reaches_the_db(recon, capsys, monkeypatch, argv, env):
    if env is not None:
        monkeypatch.setenv(KEY_ENV, env)
    recon.add("things", "x")
    rid = recon.receipt("x")
    before = dump(recon.path)
    _, out, err = recon.run(capsys, rid, *argv)
    assert b"SECRET-" not in recon.db_bytes(), "the credential is in the database"
    assert "SECRET-" not in out + err
    assert dump(recon.path) == before  # no "read" that never left recorded as one
