"""
The fixtures of the `receipts` CLI tests (tests/cli/conftest.py) for the ones here, which start
processes: the CLI as its own process, or a proxy it decides for. `many` is the large database
of tests/cli/test_receipt_commands_list.py.
"""

from tests.cli.conftest import alice, db, no_default_db, reads_upstream, recon, review, timeline
from tests.cli.test_receipt_commands_list import many

__all__ = ["alice", "db", "many", "no_default_db", "reads_upstream", "recon", "review", "timeline"]
