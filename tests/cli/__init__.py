"""Unit tests of the `receipts` CLI (proxy_addon/cli/), in-process: test_<module>.py, or test_<module>_<command>.py
for a module of several commands. As a process of its own: tests/e2e/cli/."""
