"""`launch/device_bench.sh`, the prepared accelerator benchmark: its smoke case on the CPU writes the JSON lines
of bench.device with the JAX that ran them, and every wheel it carries to an offline host is pinned here."""

import json
import os
import re
import subprocess
import sys

import jax

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "launch", "device_bench.sh")


def test_smoke_case_writes_json_lines(tmp_path):
  env = {**os.environ, "PYTHON": sys.executable, "OUT_DIR": str(tmp_path), "JAX_PLATFORMS": "cpu"}
  env.pop("XLA_FLAGS", None)  # one device, as CI's processes have
  out = subprocess.run(["bash", SCRIPT, "--smoke", "--parts", "sampler"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=300)
  assert out.returncode == 0, out.stderr + out.stdout
  lines = [json.loads(line) for line in (tmp_path / "device_bench.jsonl").read_text().splitlines()]
  assert [line["part"] for line in lines] == ["sampler"]
  assert lines[0]["jax"] == jax.__version__ and lines[0]["attention"] == "xla" and lines[0]["backend"] == "cpu"
  assert "1 JSON line(s)" in out.stdout and (tmp_path / "device_bench.log").exists()


def test_carried_wheels_are_the_projects_pins():
  text = open(SCRIPT).read()
  pins = re.search(r"^pins=\(([^)]*)\)", text, re.M).group(1).split()
  reqs = open(os.path.join(REPO, "requirements.txt")).read()
  for name in pins:
    assert re.search(rf"^{name}==\S+", reqs, re.M | re.I), name
