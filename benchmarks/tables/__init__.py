"""Every results table in README.md and docs/, generated from committed result files
(``python -m benchmarks.tables``; ``--check`` fails where a page differs)."""
