"""The receipt-proxy benchmark: `scripts/bench --help`, and docs/benchmarks.md for the figures."""
