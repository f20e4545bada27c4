"""Print one closing line for all test runs from their JUnit reports; exit 1 on any failure.

Multi-rank tests count once per rank (each rank runs every test). Every report named is
expected: a missing one (a rank that died before writing it) and one that executed no test
count as failures.
"""

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def main(paths: list[str]) -> int:
    passed = failed = skipped = 0
    for p in paths:
        if not Path(p).exists():
            print(f"missing report {Path(p).name}: that run died before finishing")
            failed += 1
            continue
        for suite in ET.parse(p).getroot().iter("testsuite"):
            tests, fail = int(suite.get("tests", 0)), int(suite.get("failures", 0))
            err, skip = int(suite.get("errors", 0)), int(suite.get("skipped", 0))
            print(f"{Path(p).stem}: {tests - fail - err - skip} passed, {fail + err} failed, "
                  f"{skip} skipped")
            if tests - skip == 0:  # a stage that ran nothing proves nothing
                print(f"{Path(p).stem}: executed no test")
                failed += 1
            passed += tests - fail - err - skip
            failed += fail + err
            skipped += skip
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
