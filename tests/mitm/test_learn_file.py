"""
receipts_learn (mitm/learn_file.py) with mitmproxy's test helpers: every write's shape appended as it
comes, matched by a rule or not, its path's ids as {id}; field names with keyed hashes, never a value,
a secret-named field or a header's value; reads not written; a duplicate the proxy answered itself
has no status; a file that cannot be opened is refused at configure, naming it, and a write that fails
later is logged once and the flow goes on.
"""

from __future__ import annotations

import json
import logging

import pytest
from mitmproxy import exceptions, http
from mitmproxy.test import tflow

from proxy_addon.draft.request_shapes import read_shape_lines
from proxy_addon.mitm.learn_file import LearnFile, learned_path
from tests.conftest import SECRETS
from tests.mitm.conftest import order, running, send


def write(method: str, url: str, body: dict, status: int | None = 201) -> http.HTTPFlow:
    f = tflow.tflow()
    headers: dict[str | bytes, str | bytes] = {
        "content-type": "application/json",
        "authorization": SECRETS["authorization"],
        "api-key": SECRETS["api-key"],
        "cookie": SECRETS["cookie"],
    }
    f.request = http.Request.make(method, url, json.dumps(body), headers)
    f.response = http.Response.make(status, b"{}") if status else None
    return f


def test_ids_in_a_learned_path_are_written_as_id():
    assert learned_path("/v1/orders/ord_8f3k2m/refunds/42") == "/v1/orders/{id}/refunds/{id}"
    assert learned_path("/api/bot123456789:" + "A" * 35 + "/sendMessage") == "/api/REDACTED/sendMessage"


async def test_every_write_seen_is_written_with_names_and_hashes_only(tmp_path):
    learn = tmp_path / "learn.jsonl"
    async with running(tmp_path) as (addon, tctx):
        learner = tctx.master.addons.get("learnfile")
        assert isinstance(learner, LearnFile)
        tctx.configure(learner, receipts_learn=str(learn))
        url = f"https://api.other.test/v2/notes/550e8400-e29b-41d4-a716-446655440000?token={SECRETS['token']}"
        body = {"title": "Hello", "text": "Hello", "password": SECRETS["blob"], "meta": {"x_thing": SECRETS["x_thing"]}}
        learner.response(write("POST", url, body))  # no rule matches it
        learner.response(write("GET", "https://api.other.test/v2/notes", {}))  # a read: not written
        failed = write("PATCH", "https://api.other.test/v2/notes/7", {"title": "x"}, status=None)
        learner.error(failed)
        first = order("A-1")  # matched by the rules: sent, its answer recorded
        await send(addon, first)
        first.response = http.Response.make(201, b"{}")
        await addon.response(first)
        learner.response(first)
        again = order("A-1")  # a duplicate, answered by the proxy itself
        await send(addon, again)
        assert again.response is not None and again.response.status_code in (200, 201, 409)
        learner.response(again)
    text = learn.read_text()
    for secret in SECRETS.values():
        assert secret not in text
    assert "Hello" not in text and "A-1" not in text and "550e8400" not in text
    shapes = list(read_shape_lines(text.splitlines(), str(learn)))
    assert [(s.method, s.path, s.status) for s in shapes] == [
        ("POST", "/v2/notes/{id}", 201),
        ("PATCH", "/v2/notes/{id}", None),
        ("POST", "/v1/orders", 201),
        ("POST", "/v1/orders", None),  # the proxy's own answer is no upstream status
    ]
    note = shapes[0]
    assert note.hashed and note.query == ("token",)
    assert note.fields["title"] == note.fields["text"] and str(note.fields["title"]).startswith("h:")
    assert note.fields["password"] is None  # named like a secret: no hash at all
    assert str(note.fields["meta.x_thing"]).startswith("h:")  # any other value: a keyed hash, never the value
    assert note.credential_headers == ("authorization", "api-key")
    assert shapes[2].fields["sku"] == shapes[3].fields["sku"]  # one run, one key: equal values compare


async def test_a_file_that_cannot_be_opened_is_refused_naming_it(tmp_path):
    async with running(tmp_path) as (_, tctx):
        learner = tctx.master.addons.get("learnfile")
        missing = tmp_path / "no-such-dir" / "learn.jsonl"
        with pytest.raises(exceptions.OptionsError, match=f"receipts_learn: cannot write {missing}"):
            tctx.configure(learner, receipts_learn=str(missing))


async def test_a_write_that_fails_is_logged_and_the_flow_goes_on(tmp_path, caplog):
    async with running(tmp_path) as (_, tctx):
        learner = tctx.master.addons.get("learnfile")
        tctx.configure(learner, receipts_learn="/dev/full")  # opens, but every write fails: no space left
        f = write("POST", "https://api.other.test/v2/notes", {"title": "x"})
        with caplog.at_level(logging.ERROR):
            learner.response(f)
            learner.response(f)
        assert f.response is not None and f.response.status_code == 201 and not f.error
    lines = [r.getMessage() for r in caplog.records if "receipts_learn" in r.getMessage()]
    assert len(lines) == 1 and "cannot write /dev/full" in lines[0]  # once a minute, not once a flow


async def test_two_runs_hash_with_two_keys(tmp_path):
    hashes = []
    for run in ("a", "b"):
        learn = tmp_path / f"{run}.jsonl"
        (tmp_path / run).mkdir()
        async with running(tmp_path / run) as (_, tctx):
            learner = tctx.master.addons.get("learnfile")
            tctx.configure(learner, receipts_learn=str(learn))
            learner.response(write("POST", "https://api.other.test/v2/notes", {"title": "same"}))
        (shape,) = read_shape_lines(learn.read_text().splitlines(), str(learn))
        hashes.append(shape.fields["title"])
    assert hashes[0] != hashes[1]  # the key is made at start and never written: no run's hash is another's
