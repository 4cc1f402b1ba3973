"""Tests for the `receipts` CLI (proxy_addon.cli), in-process and as the installed script: one file per command or group."""
