#!/usr/bin/env bash
# Shared set-up for launch/local.sh and launch/test.sh: creates .venv if missing, installs the
# pinned requirements (skipped when nothing changed since the last install), installs the package
# in editable mode, and makes sure bubblewrap (the code sandbox) is present.
# Usage: source launch/setup.sh [runtime|test]
set -euo pipefail
_kind="${1:-runtime}"
_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$_root"

_py="${PYTHON:-}"
if [ -z "$_py" ]; then
  for c in python3.11 python3; do command -v "$c" >/dev/null 2>&1 && { _py="$c"; break; }; done
fi
[ -n "$_py" ] || { echo "setup: no python3 found; install CPython 3.11" >&2; exit 1; }

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($_py --version)"
  "$_py" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate

_req=requirements.txt
[ "$_kind" = test ] && _req=requirements-test.txt
_stamp=".venv/.installed-$_kind"
_want="$(cat requirements.txt "$_req" pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ ! -f "$_stamp" ] || [ "$(cat "$_stamp")" != "$_want" ]; then
  echo "setup: installing $_req into .venv"
  python -m pip install -q --upgrade pip
  python -m pip install -q -r "$_req"
  python -m pip install -q --no-deps -e .
  echo "$_want" > "$_stamp"
fi

# The benchmarks' Tunix peer lives in its own venv (its pins conflict with ours: bench/requirements-tunix.txt).
# CI builds it so that the tests comparing against Tunix run rather than skip; elsewhere AGENTRL_TUNIX=1 asks.
_ci=0
case "${CI:-}" in 1|true|TRUE|True|yes) _ci=1 ;; esac
if [ "$_kind" = test ] && { [ "$_ci" = 1 ] || [ "${AGENTRL_TUNIX:-0}" = 1 ]; }; then
  _treq=agentrl_jax/bench/requirements-tunix.txt
  _tstamp=".venv-tunix/.installed"
  _twant="$(sha256sum "$_treq" | cut -d' ' -f1)"
  if [ ! -f "$_tstamp" ] || [ "$(cat "$_tstamp")" != "$_twant" ]; then
    echo "setup: installing $_treq into .venv-tunix (the benchmarks' Tunix peer)"
    [ -x .venv-tunix/bin/python ] || "$_py" -m venv .venv-tunix
    .venv-tunix/bin/python -m pip install -q --upgrade pip
    .venv-tunix/bin/python -m pip install -q -r "$_treq"
    echo "$_twant" > "$_tstamp"
  fi
fi

if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing bubblewrap (the code sandbox) with apt-get"
    apt-get install -y -q bubblewrap >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q bubblewrap >/dev/null; }
  else
    echo "setup: WARNING: bubblewrap (bwrap) is missing and this shell is not root." >&2
    echo "setup: install it with 'sudo apt-get install bubblewrap' (Debian/Ubuntu); without it the" >&2
    echo "setup: code tool refuses to run model code unless tools.allow_unsandboxed is set." >&2
  fi
fi
# The decode attention kernel on XLA:CPU (agentrl_jax/models/cpu_kernels.py) is compiled on first use: it needs a
# C++17 compiler. Without one decode keeps the slower XLA form (and the kernel's tests fail).
if [ -z "${CXX:-}" ] && ! command -v c++ >/dev/null 2>&1 && ! command -v g++ >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing g++ (builds the CPU decode attention kernel) with apt-get"
    apt-get install -y -q g++ >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q g++ >/dev/null; }
  else
    echo "setup: WARNING: no C++ compiler (g++): decode on CPU keeps its slower XLA attention;" >&2
    echo "setup: install one with 'sudo apt-get install g++'." >&2
  fi
fi
# CI must not pass by skipping the sandbox's tests: without bubblewrap there, stop now with the reason.
case "${CI:-}" in
  1|true|TRUE|True|yes)
    command -v bwrap >/dev/null 2>&1 || { echo "setup: CI=true and bubblewrap (bwrap) is missing: the sandbox's tests cannot run" >&2; exit 1; } ;;
esac
