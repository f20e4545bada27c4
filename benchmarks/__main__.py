"""``python -m benchmarks``: the lab's commands (``benchmarks.cli``)."""

from benchmarks.cli import main

main()
