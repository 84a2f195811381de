"""Synthetic clusters and the benchmark that measures gwpolicy on them (docs/performance.md)."""
