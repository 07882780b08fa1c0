"""Speed and learning comparisons, each run from the repository root as `python -m benchmarks.X`
(docs/benchmarks.md lists them; BENCHMARKS.md holds the current figures)."""
