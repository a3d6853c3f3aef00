#!/usr/bin/env bash
# run-tests.sh BUILD -- the test suites of `make test`: the Python package's pytest suite
# (python/tests, against the package assembled in BUILD/python), then the C suite
# (BUILD/kvattn_tests), whose summary "N passed, N failed, N skipped" is the last line printed.
# Exits non-zero if either fails. Without pytest or the extension the Python suite is skipped
# with a note (under CI=true that is a failure: CI installs both).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
BUILD=${1:-build}
PY=${PYTHON:-python3}
py_rc=0
echo "== Python tests: pytest python/tests (package in $BUILD/python) =="
if [ ! -f "$BUILD/python/kvattn/_ext.abi3.so" ]; then
    echo "skipped: the extension was not built (no Python development headers found by CMake)"
    [ "${CI:-}" = true ] && py_rc=1
elif ! "$PY" -c "import pytest, numpy" 2>/dev/null; then
    echo "skipped: pytest and numpy are needed (pip install -r python/requirements-test.txt)"
    [ "${CI:-}" = true ] && py_rc=1
else
    PYTHONPATH="$PWD/$BUILD/python${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m pytest -q -p no:cacheprovider python/tests
    py_rc=$?
    if [ $py_rc -eq 5 ]; then # pytest: no tests collected
        echo "pytest collected no tests"
        py_rc=0
    fi
fi
echo "== C tests: $BUILD/kvattn_tests =="
"./$BUILD/kvattn_tests"
c_rc=$?
if [ $py_rc -ne 0 ] || [ $c_rc -ne 0 ]; then
    echo "make test: FAILED (python rc=$py_rc, C rc=$c_rc)" >&2
    exit 1
fi
