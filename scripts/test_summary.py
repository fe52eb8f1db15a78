"""One pytest-style summary line for several pytest runs (the phases of scripts/test.sh).

    python scripts/test_summary.py SECONDS RESULT.xml [RESULT.xml ...]

Sums the JUnit XML files pytest wrote (``--junitxml``) and prints, as pytest does,
``==== 3 failed, 2301 passed, 12 skipped, 1 error in 912.31s (0:15:12) ====`` with
``SECONDS`` as the time (the phases' wall clock). A file that is missing or unreadable (its
pytest crashed before writing it) counts as one error and is named on the line before.
Standard library only: it runs before, and without, the test environment.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from datetime import timedelta

ORDER = ("failed", "passed", "skipped", "error")


def counts(path: str) -> dict[str, int]:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = dict.fromkeys(ORDER, 0)
    for suite in suites:
        tests = int(suite.get("tests", 0))
        failures = int(suite.get("failures", 0))
        errors = int(suite.get("errors", 0))
        skipped = int(suite.get("skipped", 0))
        total["failed"] += failures
        total["error"] += errors
        total["skipped"] += skipped
        total["passed"] += max(0, tests - failures - errors - skipped)
    return total


def summary(seconds: float, paths: list[str]) -> tuple[str, list[str]]:
    total = dict.fromkeys(ORDER, 0)
    problems = []
    for path in paths:
        try:
            found = counts(path)
        except (OSError, ET.ParseError) as exc:
            problems.append(f"no results from {path}: {exc}")
            total["error"] += 1
            continue
        for key, value in found.items():
            total[key] += value
    parts = [f"{total[k]} {'errors' if k == 'error' and total[k] > 1 else k}"
             for k in ORDER if total[k]]
    clock = str(timedelta(seconds=int(seconds)))
    text = f" {', '.join(parts) or 'no tests ran'} in {seconds:.2f}s ({clock}) "
    return text.center(max(len(text) + 8, 80), "="), problems


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    line, problems = summary(float(argv[0]), argv[1:])
    for problem in problems:
        print(problem)
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
