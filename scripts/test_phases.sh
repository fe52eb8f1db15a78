#!/usr/bin/env bash
# The phases of scripts/test.sh, which sets up the machine first. Every phase runs, whatever
# an earlier one did; each prints its own summary; the status is non-zero if any failed,
# and the last line is one pytest summary with the counts of every pytest phase.
#
#   test_phases.sh PYTHON SERIAL_FILE... -- [PYTEST_ARGS...]
#
# No PYTEST_ARGS: the SERIAL files (docker's tests) alone first, then the rest on
# CORRAL_TEST_WORKERS workers (default 2; 0: in-process). PYTEST_ARGS: that selection only,
# on the workers. CORRAL_TEST_CHECKS=0 skips mypy and ruff (this script's own test).
set -uo pipefail
py=$1; shift
serial=()
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do serial+=("$1"); shift; done
[ "$#" -gt 0 ] && shift
bin=$(dirname "$py")
results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT
failed=()
xmls=()
started=$SECONDS

phase() {  # phase NAME COMMAND...: run it, remember a failure, never stop
  local name=$1; shift
  echo "== $name"
  "$@"
  local status=$?
  [ "$status" = 0 ] || failed+=("$name (exit $status)")
}

if [ "${CORRAL_TEST_CHECKS:-1}" != 0 ]; then
  phase "mypy --strict" "$bin/mypy"
  phase "ruff" "$bin/ruff" check src tests bench
fi
# Said before pytest so that pytest's summary stays the last line CI prints.
echo "== screenshots of the web page go to ${CORRAL_ARTIFACTS:-artifacts}/screenshots"
workers=(-n "${CORRAL_TEST_WORKERS:-2}" --dist loadfile)
[ "${CORRAL_TEST_WORKERS:-2}" = 0 ] && workers=()
if [ "$#" = 0 ] && [ "${#serial[@]}" -gt 0 ]; then
  xmls+=("$results/serial.xml")
  phase "pytest: the docker provider's tests, alone" \
    "$py" -m pytest --junitxml="$results/serial.xml" --durations=15 "${serial[@]}"
  set -- "${serial[@]/#/--ignore=}"
fi
xmls+=("$results/rest.xml")
phase "pytest" "$py" -m pytest "${workers[@]}" --junitxml="$results/rest.xml" --durations=25 "$@"

echo "== all phases"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "failed phases: ${failed[*]}"
fi
"$py" "$(dirname "$0")/test_summary.py" "$((SECONDS - started))" "${xmls[@]}"
[ "${#failed[@]}" = 0 ]
