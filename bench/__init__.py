"""Benchmark scripts (run as files: python bench/<name>.py); see docs/benchmarks.md."""
