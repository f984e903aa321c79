"""The sandbox's guarantees as a normal user, when the suite runs as root (as CI does): the same tests, run as an
unprivileged uid with no capabilities (`tests/normal_user.py`), must pass with nothing skipped. Where the suite
itself runs as a normal user, every test of the sandbox already ran that way and these are skipped as such.

Root and non-root differ where it matters: without root every process of a sandbox runs as the user's own uid
(no random uid per program), bubblewrap works in a user namespace, the worker's zygote in one of its own, and
stdout's pipe belongs to that same uid (the verdict-forging race of tests/tools/test_harness_attacks.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests import normal_user
from tests.tools.sandbox_testing import needs_bwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = [needs_bwrap, pytest.mark.skipif(not normal_user.is_root(),
                                              reason="this run is a normal user's: every sandbox test ran as one")]


def run_as_normal_user(*pytest_args: str, timeout: float) -> str:
  """Runs pytest as a normal user; returns its output after checking that everything passed, nothing skipped."""
  cmd = normal_user.command([sys.executable, "-m", "pytest", "-q", "-n", "0", "-rs", "-p", "no:randomly",
                             *pytest_args])
  proc = subprocess.run(cmd, cwd=ROOT, env=normal_user.env(), capture_output=True, text=True, timeout=timeout,
                        check=False)
  out = proc.stdout + proc.stderr
  summary = out.strip().splitlines()[-1] if out.strip() else ""
  assert proc.returncode == 0, out[-6000:]
  assert re.search(r"\d+ passed", summary) and not re.search(r"skipped|failed|error", summary), out[-6000:]
  return out


def test_the_attacks_that_differ_without_root_are_blocked_as_a_normal_user():
  run_as_normal_user("tests/tools/test_harness_attacks.py", "tests/tools/test_tools_sandbox_worker.py", "-k",
                     "grandchild or steal or ptrace or kill or forged or normal_user or pid_1 or nothing_to_the_next "
                     "or user_namespaces",
                     timeout=300)


@pytest.mark.slow
def test_every_sandbox_test_passes_as_a_normal_user():
  run_as_normal_user("tests/tools", "--ignore=tests/tools/test_tools_as_normal_user.py",
                     "tests/rewards/test_rewards_humaneval.py", "tests/rewards/test_rewards_choice_and_code.py",
                     timeout=1200)
