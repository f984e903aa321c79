#!/usr/bin/env bash
# Set up (creates .venv, installs runtime + test requirements) and run the test suite.
# Extra arguments go to pytest, e.g. `bash launch/test.sh -m slow` or `bash launch/test.sh tests/models`.
set -euo pipefail
source "$(dirname "$0")/setup.sh" test
# Two workers: JAX compilation is mostly single-threaded, so this roughly halves wall time on 2 cores.
exec python -m pytest -q -rs -n "${PYTEST_WORKERS:-2}" --dist loadfile --durations=25 "$@"
