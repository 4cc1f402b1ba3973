"""
Settling an unknown outcome with a read, never a second write: the one reconcile for the proxy
and the CLI (settle.py), reads over HTTP and through an MCP tool or task (http_reads.py,
tool_reads.py, task_reads.py), what a read proves (judge.py, pages.py), and the bound on reads
at once (read_slots.py).
"""
