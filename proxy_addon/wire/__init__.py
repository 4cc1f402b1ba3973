"""
What a request and an answer say, read one way: the canonical target, bodies and their
encodings, header fields, JSON (json_body.py, jsonpath.py), GraphQL, JSON-RPC and MCP tool
calls, event streams, redaction of secrets, and the upstream's TLS settings. Imports nothing
of receipt-proxy but errors.py: everything else reads the wire through it.
"""
