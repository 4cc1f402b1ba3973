"""
The OpenAPI drafter on small documents written here, one rule of it at a time: local `$ref`s followed
(and a remote or looping one refused, naming where), secrets and blobs kept out of the fingerprint,
the idempotency header, the id, `record: false` for an answer that holds a key, the reads it drafts
(a list with its cursor, the object a PATCH changes), the 4xx it names for the user, Swagger 2.0's
form fields, a document with no host, and `receipts rules draft` itself.
"""

from __future__ import annotations

import json
import re

import pytest

from proxy_addon.cli import main
from proxy_addon.draft import draft_openapi, parse_document, write_draft
from proxy_addon.errors import DraftError
from proxy_addon.outcome.classify import classify_status
from proxy_addon.rules import check_rules, load_rules
from proxy_addon.rules.todo_comments import todos_in
from proxy_addon.states import State

SHOP = {
    "openapi": "3.0.3",
    "info": {"title": "Shop", "version": "1"},
    "servers": [{"url": "https://api.shop.test/v1"}],
    "components": {
        "securitySchemes": {"key": {"type": "apiKey", "in": "header", "name": "X-Api-Key"}},
        "parameters": {
            "Limit": {"name": "limit", "in": "query", "schema": {"type": "integer", "maximum": 50}},
            "After": {"name": "after", "in": "query", "schema": {"type": "string"}},
        },
        "schemas": {
            "OrderIn": {
                "allOf": [
                    {"$ref": "#/components/schemas/Base"},
                    {
                        "type": "object",
                        "required": ["sku", "client_secret"],
                        "properties": {
                            "sku": {"type": "string"},
                            "client_secret": {"type": "string"},
                            "password": {"type": "string"},
                            "receipt_pdf": {"type": "string", "format": "binary"},
                            "metadata": {"type": "object"},
                            "note": {"type": "string"},
                        },
                    },
                ]
            },
            "Base": {"type": "object", "required": ["quantity"], "properties": {"quantity": {"type": "integer"}}},
            "Order": {
                "type": "object",
                "properties": {"id": {"type": "string"}, "sku": {"type": "string"}, "quantity": {"type": "integer"}},
            },
            "Orders": {
                "type": "object",
                "properties": {
                    "has_more": {"type": "boolean"},
                    "data": {"type": "array", "items": {"$ref": "#/components/schemas/Order"}},
                },
            },
        },
    },
    "security": [{"key": []}],
    "paths": {
        "/orders": {
            "post": {
                "operationId": "orders/create",
                "summary": "Create an order",
                "parameters": [{"in": "header", "name": "Idempotency-Key", "schema": {"type": "string"}}],
                "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/OrderIn"}}}},
                "responses": {
                    "201": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Order"}}}},
                    "409": {"description": "an order with this sku exists"},
                    "422": {"description": "invalid"},
                },
            },
            "get": {
                "parameters": [{"$ref": "#/components/parameters/Limit"}, {"$ref": "#/components/parameters/After"}],
                "responses": {
                    "200": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Orders"}}}}
                },
            },
        },
        "/orders/{order-id}": {
            "get": {
                "parameters": [{"name": "order-id", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {
                    "200": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Order"}}}}
                },
            },
            "patch": {
                "operationId": "orders/update",
                "requestBody": {
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "required": ["quantity"],
                                "properties": {"quantity": {"type": "integer"}},
                            }
                        }
                    }
                },
                "responses": {
                    "200": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Order"}}}}
                },
            },
            "delete": {"operationId": "orders/delete", "responses": {"204": {"description": "gone"}}},
        },
        "/orders/search": {
            "post": {"operationId": "orders/search", "responses": {"200": {"description": "found"}}},
        },
        "/keys": {
            "post": {
                "operationId": "keys/create",
                "requestBody": {
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "required": ["name"],
                                "properties": {"name": {"type": "string"}},
                            }
                        }
                    }
                },
                "responses": {
                    "201": {
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "properties": {"id": {"type": "string"}, "token": {"type": "string"}},
                                }
                            }
                        }
                    }
                },
            }
        },
    },
}


def drafted(doc: dict, **kw) -> str:
    text = write_draft(draft_openapi(parse_document(json.dumps(doc), "shop.json"), **kw))
    assert check_rules(text, source="draft") == [], text
    return text


def test_a_rest_document_drafts_its_writes_with_what_it_says():
    text = drafted(SHOP)
    rf = load_rules(text, source="draft")
    ops = {op.name: op for op in rf.operations}
    assert rf.api == "shop" and rf.hosts == ("api.shop.test",)
    assert sorted(ops) == ["keys.create", "orders.create", "orders.delete", "orders.update"]
    create = ops["orders.create"]
    assert (create.method, create.path.template) == ("POST", "/v1/orders")
    # required (allOf through a $ref) and identifying, never a secret or a blob
    assert create.fingerprint.body == ("quantity", "sku")
    assert create.idempotency_header == "Idempotency-Key"
    assert create.external_id == "id"
    assert create.credential_headers == ("x-api-key",)
    read = create.reconcile
    assert read is not None and read.url == "/v1/orders?limit=50" and read.items == "data"
    assert dict(read.find) == {"quantity": "{intent.quantity}", "sku": "{intent.sku}"}
    assert read.absence_provable is False
    assert read.pages is not None and (read.pages.more, read.pages.from_, read.pages.param) == (
        "has_more",
        "data.-1.id",
        "after",
    )
    update = ops["orders.update"]
    assert update.path.template == "/v1/orders/{order_id}"  # a parameter name the rules take
    assert update.reconcile is not None and update.reconcile.url == "/v1/orders/{path.order_id}"
    assert dict(update.reconcile.find) == {"quantity": "{intent.quantity}"}
    assert ops["orders.delete"].reconcile is None
    assert ops["keys.create"].record is False  # its answer holds a token
    assert [t.template for t in rf.post_reads] == ["/v1/orders/search"]


def test_what_the_draft_left_out_and_the_errors_it_names_are_todos_saying_where():
    todos = [t for _, t in todos_in(drafted(SHOP))]
    left = next(t for t in todos if "Left out of #/paths/~1orders/post/requestBody" in t)
    assert "looks like a secret, never fingerprinted: client_secret, password" in left
    assert "a blob (bytes, base64 or a free-form object): receipt_pdf, metadata" in left
    assert "neither required nor identifying: note" in left
    assert any("#/paths/~1orders/post/responses: 409, 422" in t for t in todos)
    assert any("declares the header Idempotency-Key" in t and "ttl" in t for t in todos)


def test_no_409_is_a_refusal_even_where_the_document_documents_one():
    rf = load_rules(drafted(SHOP), source="draft")
    assert all(classify_status(409, op) != State.REJECTED for op in rf.operations)
    assert all(not op.classify and not op.classify_rules for op in rf.operations)


@pytest.mark.parametrize(
    ("ref", "problem"),
    [
        ("other.yaml#/components/schemas/X", "is not local"),
        ("https://example.test/x.json", "is not local"),
        ("#/components/schemas/Nowhere", "points at nothing"),
        ("#/components/schemas/Loop", "leads back to itself"),
    ],
)
def test_a_ref_it_cannot_follow_is_refused_naming_where(ref, problem):
    doc = json.loads(json.dumps(SHOP))
    doc["components"]["schemas"]["Loop"] = {"$ref": "#/components/schemas/Loop"}
    doc["paths"]["/orders"]["post"]["requestBody"]["content"]["application/json"]["schema"] = {"$ref": ref}
    with pytest.raises(DraftError, match=re.escape(problem)) as e:
        draft_openapi(parse_document(json.dumps(doc), "shop.json"))
    assert str(e.value).startswith("shop.json: ")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[1, 2]", "the top level is not a mapping"),
        ("openapi: 3.0.0\ninfo: {title: x}\n", "no paths"),
        ("info: {title: x}\npaths: {}\n", "not an OpenAPI 3.x or Swagger 2.0 document"),
        ("{not json", "neither JSON nor YAML"),
    ],
)
def test_a_file_that_is_no_openapi_document_is_refused(text, problem):
    with pytest.raises(DraftError, match=re.escape(problem)):
        parse_document(text, "x.yaml")


def test_swagger_form_fields_and_a_document_without_a_host():
    doc = {
        "swagger": "2.0",
        "info": {"title": "Forms"},
        "basePath": "/api",
        "paths": {
            "/notes.add": {
                "post": {
                    "parameters": [
                        {"name": "token", "in": "formData", "required": True, "type": "string"},
                        {"name": "title", "in": "formData", "required": True, "type": "string"},
                    ],
                    "responses": {"200": {"schema": {"type": "object", "properties": {"note_id": {"type": "string"}}}}},
                }
            }
        },
    }
    text = drafted(doc)
    rf = load_rules(text, source="draft")
    (op,) = rf.operations
    assert (op.method, op.path.template, op.fingerprint.body, op.external_id) == (
        "POST",
        "/api/notes.add",
        ("title",),
        "note_id",
    )
    assert rf.hosts == ("api.example.invalid",)
    assert any("names no host" in t for _, t in todos_in(text))
    assert load_rules(drafted(doc, host="notes.test"), source="d").hosts == ("notes.test",)


def test_rules_draft_writes_a_file_rules_check_passes(tmp_path, capsys):
    src = tmp_path / "shop.yaml"
    src.write_text(json.dumps(SHOP))  # JSON is YAML
    assert main(["rules", "draft", "--openapi", str(src)]) == 0
    out, err = capsys.readouterr()
    assert "drafted 4 operations (1 post_reads) with" in err
    path = tmp_path / "rules.yaml"
    path.write_text(out)
    assert main(["rules", "check", str(path)]) == 0
    assert "TODO:" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--openapi", "missing.yaml"], "--openapi missing.yaml: No such file"),
        (["--writes", "(", "--openapi", "x"], "--writes '(': not a regular expression"),
    ],
)
def test_rules_draft_says_what_is_wrong_with_its_input(args, problem, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["rules", "draft", *args]) != 0
    assert problem in capsys.readouterr().err


def test_a_host_the_rules_refuse_prints_no_draft(tmp_path, capsys):
    src = tmp_path / "shop.json"
    src.write_text(json.dumps(SHOP))
    assert main(["rules", "draft", "--openapi", str(src), "--host", "bad host!"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "the draft does not load" in err and "hosts" in err
