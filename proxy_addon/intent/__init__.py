"""
What a matched write means: its fingerprint under today's scheme and earlier ones, the
allowlisted view of its body, who sends it (caller.py: the principal), an MCP call's
arguments, and the key an API deduplicates by (identity.py). Reads the wire (wire/) as the
rules (rules/) say; builds the store's Attempt.
"""
