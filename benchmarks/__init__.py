"""Figures printed side by side (python -m benchmarks.<name>; docs/results.md)."""
