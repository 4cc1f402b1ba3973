"""
rules/openai.yaml against a fake OpenAI API: file uploads (multipart), batches, vector
store files and conversation items, with the list/retrieve endpoints the pack reads.

The fake follows a per-object script for each write ("ok", "commit_drop", "drop",
"http500", "invalid") keyed by the upload's filename, the batch's input_file_id, the
attached file_id or the first item's text. Every test uses its own names and ids.
"""

from __future__ import annotations

import email.message
import email.parser
import hashlib
import re
import threading
import time
import uuid
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.e2e.packs.harness import PackRun, Seen, State, ours, pack_run

KEY = "Bearer sk-proj-FAKEfakeFAKEfake0000NotARealKey0000000000000000"
PROJECT = "proj_FAKE4aCq0000000000000000"
VS_FILES = re.compile(r"/v1/vector_stores/([^/]+)/files")
VS_FILE = re.compile(r"/v1/vector_stores/([^/]+)/files/([^/]+)")
ITEMS = re.compile(r"/v1/conversations/([^/]+)/items")


def oai_error(status: int, message: str, type_: str = "invalid_request_error", param: str | None = None):
    return status, {}, {"error": {"message": message, "type": type_, "param": param, "code": None}}


def multipart(seen: Seen) -> dict[str, Any]:
    """The parts of a multipart/form-data body: text parts as str, file parts as (filename, bytes)."""
    raw = b"Content-Type: " + seen.headers["content-type"].encode() + b"\r\n\r\n" + seen.body
    msg = email.parser.BytesParser().parsebytes(raw)
    out: dict[str, Any] = {}
    for part in msg.get_payload():
        assert isinstance(part, email.message.Message), part  # multipart: its payload is its parts
        name = part.get_param("name", header="content-disposition")
        filename = part.get_filename()
        data = part.get_payload(decode=True)
        assert isinstance(name, str) and isinstance(data, bytes), (name, data)
        out[name] = (filename, data) if filename else data.decode()
    return out


class FakeOpenAI:
    def __init__(self) -> None:
        self.files: list[dict[str, Any]] = []
        self.batches: list[dict[str, Any]] = []
        self.vs_files: dict[tuple[str, str], dict[str, Any]] = {}
        self.items: dict[str, list[dict[str, Any]]] = {}
        self.plans: dict[str, list[str]] = {}
        self.lock = threading.Lock()

    def plan(self, key: str, *steps: str) -> None:
        self.plans[key] = list(steps)

    def _step(self, key: str) -> str:
        with self.lock:
            steps = self.plans.get(key) or ["ok"]
            return steps.pop(0) if len(steps) > 1 else steps[0]

    def _outcome(self, step: str, create, invalid: str):
        """Run one scripted step around `create` (which stores the object and returns the answer body)."""
        if step == "invalid":
            return oai_error(400, invalid)
        if step == "http500":
            return oai_error(500, "The server had an error while processing your request.", "server_error")
        if step == "drop":
            return 0, {}, None
        body = create()
        if step == "commit_drop":
            return 0, {}, None
        return 200, {}, body

    # files
    def upload(self, seen: Seen):
        parts = multipart(seen)
        filename, content = parts["file"]

        def create():
            f = {
                "id": f"file-{uuid.uuid4().hex[:22]}",
                "object": "file",
                "bytes": len(content),
                "created_at": int(time.time()),
                "filename": filename,
                "purpose": parts["purpose"],
                "status": "processed",
                "expires_at": None,
                "status_details": None,
            }
            with self.lock:
                self.files.append(f)
            return f

        return self._outcome(
            self._step(filename),
            create,
            "'purpose' must be one of assistants, batch, fine-tune, vision, user_data, evals",
        )

    def list_files(self, seen: Seen):
        q = parse_qs(urlsplit(seen.path).query)
        with self.lock:
            data = [f for f in reversed(self.files) if f["purpose"] == q.get("purpose", [f["purpose"]])[0]]
        return (
            200,
            {},
            {
                "object": "list",
                "data": data,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
                "has_more": False,
            },
        )

    # batches
    def create_batch(self, seen: Seen):
        doc = seen.json()

        def create():
            b = {
                "id": f"batch_{uuid.uuid4().hex}",
                "object": "batch",
                "endpoint": doc["endpoint"],
                "errors": None,
                "input_file_id": doc["input_file_id"],
                "completion_window": doc["completion_window"],
                "status": "validating",
                "output_file_id": None,
                "error_file_id": None,
                "created_at": int(time.time()),
                "metadata": doc.get("metadata"),
                "request_counts": {"total": 0, "completed": 0, "failed": 0},
            }
            with self.lock:
                self.batches.append(b)
            return b

        return self._outcome(self._step(doc["input_file_id"]), create, "Invalid 'endpoint'")

    def list_batches(self, seen: Seen):
        with self.lock:
            data = list(reversed(self.batches))[:100]
        return (
            200,
            {},
            {
                "object": "list",
                "data": data,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
                "has_more": len(self.batches) > 100,
            },
        )

    # vector store files
    def attach(self, seen: Seen):
        vs = seen.path_match(VS_FILES).group(1)
        file_id = seen.json()["file_id"]

        def create():
            vf = {
                "id": file_id,
                "object": "vector_store.file",
                "usage_bytes": 0,
                "created_at": int(time.time()),
                "vector_store_id": vs,
                "status": "in_progress",
                "last_error": None,
                "chunking_strategy": {
                    "type": "static",
                    "static": {"max_chunk_size_tokens": 800, "chunk_overlap_tokens": 400},
                },
            }
            with self.lock:
                self.vs_files[(vs, file_id)] = vf
            return vf

        return self._outcome(self._step(file_id), create, f"No file found with id '{file_id}'.")

    def retrieve_vs_file(self, seen: Seen):
        vs, file_id = seen.path_match(VS_FILE).groups()
        with self.lock:
            vf = self.vs_files.get((vs, file_id))
        if vf is None:
            return oai_error(404, f"No file found with id '{file_id}' in vector store '{vs}'.")
        return 200, {}, vf

    # conversation items
    def add_items(self, seen: Seen):
        conv = seen.path_match(ITEMS).group(1)
        items = seen.json()["items"]

        def create():
            made = [
                {
                    "id": f"msg_{uuid.uuid4().hex}",
                    "type": "message",
                    "status": "completed",
                    "role": item["role"],
                    "content": item["content"],
                }
                for item in items
            ]
            with self.lock:
                self.items.setdefault(conv, []).extend(made)
            return {
                "object": "list",
                "data": made,
                "first_id": made[0]["id"],
                "last_id": made[-1]["id"],
                "has_more": False,
            }

        return self._outcome(self._step(items[0]["content"][0]["text"]), create, "Invalid 'items[0].role'")

    def list_items(self, seen: Seen):
        conv = seen.path_match(ITEMS).group(1)
        q = parse_qs(urlsplit(seen.path).query)
        limit = int(q.get("limit", ["20"])[0])
        with self.lock:
            data = list(self.items.get(conv, []))
        if q.get("order", ["desc"])[0] == "desc":
            data.reverse()
        data = data[:limit]
        return (
            200,
            {},
            {
                "object": "list",
                "data": data,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
                "has_more": False,
            },
        )


@pytest.fixture(scope="module")
def openai(tmp_path_factory, confdir):
    for run in pack_run(
        "openai.yaml",
        tmp_path_factory.mktemp("openai"),
        confdir,
        headers={"Authorization": KEY, "OpenAI-Project": PROJECT},
    ):
        fake = run.fake = FakeOpenAI()
        run.api.on("POST", "/v1/files", fake.upload)
        run.api.on("GET", "/v1/files", fake.list_files)
        run.api.on("POST", "/v1/batches", fake.create_batch)
        run.api.on("GET", "/v1/batches", fake.list_batches)
        run.api.on("POST", VS_FILES.pattern, fake.attach)
        run.api.on("GET", VS_FILE.pattern, fake.retrieve_vs_file)
        run.api.on("POST", ITEMS.pattern, fake.add_items)
        run.api.on("GET", ITEMS.pattern, fake.list_items)
        yield run


def tag() -> str:
    return uuid.uuid4().hex[:12]


def seen(run: PackRun, method: str, path: str | re.Pattern, marker: str | None = None) -> list[Seen]:
    out = []
    for s in run.api.requests(method):
        p = s.path.split("?")[0]
        if (path.fullmatch(p) if isinstance(path, re.Pattern) else p == path) and (
            marker is None or marker.encode() in s.body + s.path.encode()
        ):
            out.append(s)
    return out


to_states = PackRun.states


# --- files: multipart upload -----------------------------------------------------------------------


def upload(run: PackRun, filename: str, content: bytes, purpose: str = "batch"):
    return run.send(
        "POST", "/v1/files", data={"purpose": purpose}, files={"file": (filename, content, "application/jsonl")}
    )


def jsonl(marker: str, lines: int = 40) -> bytes:
    return b"".join(
        b'{"custom_id": "req-%d-%s", "method": "POST", "url": "/v1/chat/completions"}\n' % (i, marker.encode())
        for i in range(lines)
    )


def test_an_upload_is_fingerprinted_by_its_content_hash_and_the_content_is_never_stored(openai):
    name, marker = f"requests-{tag()}.jsonl", f"CONTENT-MARKER-{tag()}"
    content = jsonl(marker)
    r = upload(openai, name, content)
    assert r.status_code == 200 and r.headers["x-receipt-state"] == "succeeded"
    receipt = openai.receipt(r)
    assert receipt.external_id == r.json()["id"]
    part = receipt.intent["multipart"]["file"]
    assert part["sha256"] == hashlib.sha256(content).hexdigest() and part["size"] == len(content)
    assert part["filename"] == name and receipt.intent["multipart"]["purpose"] == "batch"
    # The content never reaches the database (nor its WAL), only its hash.
    stored = b"".join(p.read_bytes() for p in openai.proxy.db.parent.glob(openai.proxy.db.name + "*") if p.is_file())
    assert marker.encode() not in stored
    assert hashlib.sha256(content).hexdigest().encode() in stored


def test_the_same_name_with_other_content_is_another_upload(openai):
    name = f"requests-{tag()}.jsonl"
    one = upload(openai, name, jsonl("one"))
    two = upload(openai, name, jsonl("two"))
    again = upload(openai, name, jsonl("one"))
    assert one.headers["x-receipt-id"] != two.headers["x-receipt-id"]
    assert (
        again.headers["x-receipt-id"] == one.headers["x-receipt-id"] and again.headers["x-receipt-replayed"] == "true"
    )
    assert len(seen(openai, "POST", "/v1/files", name)) == 2


def test_an_invalid_upload_is_rejected_and_a_5xx_is_unknown(openai):
    bad, boom = f"bad-{tag()}.jsonl", f"boom-{tag()}.jsonl"
    openai.fake.plan(bad, "invalid")
    openai.fake.plan(boom, "http500")
    assert upload(openai, bad, jsonl(bad)).headers["x-receipt-state"] == "rejected"
    assert upload(openai, boom, jsonl(boom)).headers["x-receipt-state"] == "outcome_unknown"


def test_an_unknown_upload_found_in_the_files_list_succeeds(openai):
    name = f"requests-{tag()}.jsonl"
    content = jsonl(name)
    openai.fake.plan(name, "commit_drop", "ok")
    first = upload(openai, name, content)
    assert first.headers["x-receipt-state"] == "outcome_unknown"
    file_id = openai.fake.files[-1]["id"]

    retry = upload(openai, name, content)
    assert retry.headers["x-receipt-state"] == "succeeded"
    [read] = [s for s in seen(openai, "GET", "/v1/files") if s.path.endswith("purpose=batch&order=desc&limit=10000")][
        -1:
    ]
    assert read.headers["authorization"] == KEY and read.headers["openai-project"] == PROJECT  # the agent's project
    assert len(seen(openai, "POST", "/v1/files", name)) == 1
    receipt = openai.receipt(first)
    assert receipt.state is State.SUCCEEDED and receipt.external_id == file_id


def test_an_unknown_upload_not_in_the_list_goes_to_manual_review(openai):
    name = f"requests-{tag()}.jsonl"
    openai.fake.plan(name, "drop")
    first = upload(openai, name, jsonl(name))
    reads_before = len(seen(openai, "GET", "/v1/files"))
    retry = upload(openai, name, jsonl(name))
    assert retry.status_code == 409 and retry.headers["x-receipt-state"] == "manual_review"
    assert len(seen(openai, "GET", "/v1/files")) == reads_before + 1
    assert len(seen(openai, "POST", "/v1/files", name)) == 1
    assert openai.receipt(first).state is State.MANUAL_REVIEW


def test_an_older_identical_upload_is_not_taken_for_an_unknown_one(openai):
    """A file with the same name, size and purpose that existed before the attempt is not this
    attempt's file: the read's created_at bound leaves it out, so the outcome stays for a human."""
    name = f"requests-{tag()}.jsonl"
    content = jsonl(name)
    with openai.fake.lock:
        openai.fake.files.append(
            {
                "id": "file-older",
                "object": "file",
                "bytes": len(content),
                "created_at": int(time.time()) - 3600,
                "filename": name,
                "purpose": "batch",
                "status": "processed",
                "expires_at": None,
                "status_details": None,
            }
        )
    openai.fake.plan(name, "drop")
    first = upload(openai, name, content)
    assert first.headers["x-receipt-state"] == "outcome_unknown"
    retry = upload(openai, name, content)
    assert retry.status_code == 409 and retry.headers["x-receipt-state"] == "manual_review"
    receipt = openai.receipt(first)
    assert receipt.state is State.MANUAL_REVIEW and receipt.external_id is None
    assert len(seen(openai, "POST", "/v1/files", name)) == 1


def test_an_unknown_upload_on_the_second_page_of_the_files_list_succeeds_without_a_second_upload(openai):
    """The pack's files read follows `has_more` with `after` = the last file's id (issue 16): a
    dropped answer, then a first page of other files that says has_more, and the upload on
    page 2 → succeeded, one upload. (Without `pages` the first page's has_more proves nothing:
    manual review.)"""
    name = f"requests-{tag()}.jsonl"
    content = jsonl(name)
    openai.fake.plan(name, "commit_drop", "ok")
    first = upload(openai, name, content)
    assert first.headers["x-receipt-state"] == "outcome_unknown"
    mine = openai.fake.files[-1]
    others = [{**mine, "id": f"file-other{i:04d}", "filename": f"other-{i}.jsonl"} for i in range(100)]

    def page(s: Seen):
        after = parse_qs(urlsplit(s.path).query).get("after", [None])[0]
        data, more = (others, True) if after is None else ([mine], False)
        return (
            200,
            {},
            {"object": "list", "data": data, "first_id": data[0]["id"], "last_id": data[-1]["id"], "has_more": more},
        )

    reads_before = len(seen(openai, "GET", "/v1/files"))
    openai.api.on("GET", "/v1/files", page, times=2)
    retry = upload(openai, name, content)
    assert retry.status_code == 409 and retry.headers["x-receipt-state"] == "succeeded"
    assert ours(retry)["external_id"] == mine["id"]
    walked = seen(openai, "GET", "/v1/files")[reads_before:]
    assert len(walked) == 2
    assert parse_qs(urlsplit(walked[1].path).query) == {
        "purpose": ["batch"],
        "order": ["desc"],
        "limit": ["10000"],
        "after": ["file-other0099"],
    }
    assert walked[1].headers["authorization"] == KEY and walked[1].headers["openai-project"] == PROJECT
    assert len(seen(openai, "POST", "/v1/files", name)) == 1  # no second upload
    receipt = openai.receipt(first)
    assert (receipt.state, receipt.external_id) == (State.SUCCEEDED, mine["id"])


# --- batches: a receipt key in metadata -----------------------------------------------------------


def batch(input_file_id: str, **metadata: str) -> dict:
    body: dict[str, Any] = {
        "input_file_id": input_file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    if metadata:
        body["metadata"] = metadata
    return body


def test_a_batch_carries_the_receipt_key_in_its_metadata(openai):
    file_id = f"file-{tag()}"
    r = openai.send("POST", "/v1/batches", json=batch(file_id, project="nightly-evals"))
    assert r.status_code == 200 and r.headers["x-receipt-state"] == "succeeded"
    receipt = openai.receipt(r)
    [write] = seen(openai, "POST", "/v1/batches", file_id)
    assert write.json()["metadata"] == {"project": "nightly-evals", "receipt_key": receipt.idempotency_key}
    assert receipt.idempotency_key and receipt.external_id == r.json()["id"]
    assert "metadata" not in str(receipt.intent)  # the key is not part of the intent


def test_an_unknown_batch_is_found_by_its_receipt_key(openai):
    file_id = f"file-{tag()}"
    openai.fake.plan(file_id, "commit_drop", "ok")
    first = openai.send("POST", "/v1/batches", json=batch(file_id))
    assert first.headers["x-receipt-state"] == "outcome_unknown"
    batch_id = openai.fake.batches[-1]["id"]
    reads_before = len(seen(openai, "GET", "/v1/batches"))

    retry = openai.send("POST", "/v1/batches", json=batch(file_id))
    assert retry.headers["x-receipt-state"] == "succeeded"
    assert len(seen(openai, "GET", "/v1/batches")) == reads_before + 1
    assert len(seen(openai, "POST", "/v1/batches", file_id)) == 1
    assert openai.receipt(first).external_id == batch_id


def test_an_older_batch_of_the_same_file_is_not_taken_for_this_one(openai):
    """Found means this receipt's key, not merely the same input file: absence is never assumed either."""
    file_id = f"file-{tag()}"
    openai.fake.batches.append(
        {
            "id": f"batch_old{tag()}",
            "object": "batch",
            "input_file_id": file_id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            "status": "completed",
            "metadata": None,
        }
    )
    openai.fake.plan(file_id, "drop")
    first = openai.send("POST", "/v1/batches", json=batch(file_id))
    retry = openai.send("POST", "/v1/batches", json=batch(file_id))
    assert retry.status_code == 409 and retry.headers["x-receipt-state"] == "manual_review"
    assert len(seen(openai, "POST", "/v1/batches", file_id)) == 1
    assert openai.receipt(first).state is State.MANUAL_REVIEW and openai.receipt(first).external_id is None


# --- vector store files: the file id is the object's id ---------------------------------------------


def test_an_attach_succeeds_with_the_file_id_as_its_id(openai):
    vs, file_id = f"vs_{tag()}", f"file-{tag()}"
    r = openai.send("POST", f"/v1/vector_stores/{vs}/files", json={"file_id": file_id})
    assert r.headers["x-receipt-state"] == "succeeded"
    assert openai.receipt(r).external_id == file_id
    missing = f"file-{tag()}"
    openai.fake.plan(missing, "invalid")
    assert (
        openai.send("POST", f"/v1/vector_stores/{vs}/files", json={"file_id": missing}).headers["x-receipt-state"]
        == "rejected"
    )


def test_an_unknown_attach_found_by_retrieve_succeeds(openai):
    vs, file_id = f"vs_{tag()}", f"file-{tag()}"
    openai.fake.plan(file_id, "commit_drop", "ok")
    first = openai.send("POST", f"/v1/vector_stores/{vs}/files", json={"file_id": file_id})
    assert first.headers["x-receipt-state"] == "outcome_unknown"

    retry = openai.send("POST", f"/v1/vector_stores/{vs}/files", json={"file_id": file_id})
    assert retry.headers["x-receipt-state"] == "succeeded"
    assert len(seen(openai, "GET", f"/v1/vector_stores/{vs}/files/{file_id}")) == 1
    assert len(seen(openai, "POST", f"/v1/vector_stores/{vs}/files")) == 1
    receipt = openai.receipt(first)
    assert receipt.state is State.SUCCEEDED and receipt.external_id == file_id
    assert to_states(openai, receipt.operation_id) == [
        State.SUBMITTED,
        State.OUTCOME_UNKNOWN,
        State.RECONCILING,
        State.SUCCEEDED,
    ]


def test_an_unknown_attach_answered_404_is_provably_absent_and_resent(openai):
    vs, file_id = f"vs_{tag()}", f"file-{tag()}"
    openai.fake.plan(file_id, "drop", "ok")
    first = openai.send("POST", f"/v1/vector_stores/{vs}/files", json={"file_id": file_id})
    assert first.headers["x-receipt-state"] == "outcome_unknown"

    retry = openai.send("POST", f"/v1/vector_stores/{vs}/files", json={"file_id": file_id})
    assert retry.status_code == 200 and retry.headers["x-receipt-state"] == "succeeded"
    assert len(seen(openai, "GET", f"/v1/vector_stores/{vs}/files/{file_id}")) == 1
    assert len(seen(openai, "POST", f"/v1/vector_stores/{vs}/files")) == 2
    assert openai.receipt(first).state is State.SAFE_TO_RETRY
    assert openai.receipt(retry).retry_of == first.headers["x-receipt-id"]


# --- conversation items: the newest item -----------------------------------------------------------


def message(text: str, role: str = "user") -> dict:
    return {"items": [{"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}]}


def test_adding_an_item_succeeds_with_the_items_id(openai):
    conv, text = f"conv_{tag()}", f"Summarise ticket {tag()}"
    r = openai.send("POST", f"/v1/conversations/{conv}/items", json=message(text))
    assert r.headers["x-receipt-state"] == "succeeded"
    assert openai.receipt(r).external_id == r.json()["data"][0]["id"]


def test_an_unknown_item_that_is_the_newest_is_found(openai):
    conv, text = f"conv_{tag()}", f"Summarise ticket {tag()}"
    openai.send("POST", f"/v1/conversations/{conv}/items", json=message("Earlier message"))
    openai.fake.plan(text, "commit_drop", "ok")
    first = openai.send("POST", f"/v1/conversations/{conv}/items", json=message(text))
    assert first.headers["x-receipt-state"] == "outcome_unknown"
    item_id = openai.fake.items[conv][-1]["id"]

    retry = openai.send("POST", f"/v1/conversations/{conv}/items", json=message(text))
    assert retry.headers["x-receipt-state"] == "succeeded"
    [read] = seen(openai, "GET", f"/v1/conversations/{conv}/items")
    assert parse_qs(urlsplit(read.path).query) == {"order": ["desc"], "limit": ["1"]}
    assert len(seen(openai, "POST", f"/v1/conversations/{conv}/items", text)) == 1
    assert openai.receipt(first).external_id == item_id


def test_an_unknown_item_that_is_not_the_newest_goes_to_manual_review(openai):
    conv, text = f"conv_{tag()}", f"Summarise ticket {tag()}"
    openai.fake.plan(text, "drop")
    first = openai.send("POST", f"/v1/conversations/{conv}/items", json=message(text))
    assert first.headers["x-receipt-state"] == "outcome_unknown"
    openai.send("POST", f"/v1/conversations/{conv}/items", json=message("Someone else wrote since"))

    retry = openai.send("POST", f"/v1/conversations/{conv}/items", json=message(text))
    assert retry.status_code == 409 and retry.headers["x-receipt-state"] == "manual_review"
    assert len(seen(openai, "POST", f"/v1/conversations/{conv}/items", text)) == 1
    assert openai.receipt(first).state is State.MANUAL_REVIEW
