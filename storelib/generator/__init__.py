"""Synthetic stores written the way the broker writes them, for tests, demos and benchmarks."""
