"""``python -m benchmarks.tables``: rewrite the generated tables of README.md and docs/ from
the committed result files; ``--check`` only says which pages differ (exit 1 if any);
``--predict NAME...`` makes the simulator's predictions again (``all`` for every one);
``--provenance`` records date, commit, stack and machine of result files that lack them."""

from __future__ import annotations

import argparse
import sys

from benchmarks.tables import pages, predicted, sources


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.tables", description=__doc__)
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if stale")
    ap.add_argument("--predict", nargs="+", metavar="NAME",
                    choices=[*predicted.NAMES, "all"],
                    help="run the simulator again for these predictions first")
    ap.add_argument("--provenance", action="store_true",
                    help="record what git and the files say about result files lacking it")
    args = ap.parse_args(argv)
    if args.predict:
        for name in predicted.NAMES if "all" in args.predict else args.predict:
            print(f"predicted {name}: {sources.relative(predicted.predict(name))}")
    if args.provenance:
        sources.record(pages.sources())
        print(f"recorded {sources.relative(sources.PROVENANCE)}")
    if args.check:
        stale = pages.stale()
        for page in stale:
            print(f"{page}: differs from `python -m benchmarks.tables` (run it and commit)")
        return 1 if stale else 0
    for page in pages.write():
        print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
