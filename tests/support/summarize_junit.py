"""Adds up pytest's JUnit XML reports into one closing line: ``tests: N passed, N failed, N skipped``.

Exits non-zero when any test failed or errored, or when no test ran at all.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def count(report: Path) -> tuple[int, int, int]:
    total = failed = skipped = 0
    for suite in ET.parse(report).getroot().iter("testsuite"):
        total += int(suite.get("tests", 0))
        failed += int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        skipped += int(suite.get("skipped", 0))
    return total - failed - skipped, failed, skipped


def main(paths: list[str]) -> int:
    passed = failed = skipped = 0
    for path in paths:
        report = Path(path)
        if not report.is_file():
            print(f"missing test report {report}: that suite did not run to the end", file=sys.stderr)
            failed += 1
            continue
        p, f, s = count(report)
        passed, failed, skipped = passed + p, failed + f, skipped + s
    print(f"tests: {passed} passed, {failed} failed, {skipped} skipped")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
