"""`launch/tpu_vm.sh --dry-run` prints the gcloud commands for a 4-host slice (v4-32) without gcloud installed."""

import os
import shlex
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SLICE = {"TPU_NAME": "rl-slice", "ZONE": "us-central2-b", "ACCELERATOR": "v4-32", "PROJECT": "my-proj"}


def dry_run(*args, **env):
  base = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}  # no gcloud on this PATH
  out = subprocess.run(["bash", "launch/tpu_vm.sh", "--dry-run", *args], cwd=REPO, env={**base, **env},
                       capture_output=True, text=True, timeout=30)
  assert out.returncode == 0, out.stderr
  return [shlex.split(line) for line in out.stdout.splitlines()]


def test_create_setup_run_delete_on_a_4_host_slice():
  (create,) = dry_run("create", **SLICE)
  assert create[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "create"] and create[5] == "rl-slice"
  assert create[create.index("--accelerator-type") + 1] == "v4-32"
  assert create[create.index("--project") + 1] == "my-proj" and "--worker=all" not in create

  archive, scp, install = dry_run("setup", **SLICE)
  assert archive[:2] == ["git", "-C"] and "archive" in archive
  assert scp[4] == "scp" and "--worker=all" in scp and scp[-1] == "--worker=all"
  assert install[4] == "ssh" and "--worker=all" in install
  script = install[install.index("--command") + 1]
  assert "source launch/setup.sh runtime" in script and "jax[tpu]==" in script

  (run,) = dry_run("run", "configs/demystify_qwen3_4b.py", "gs://b/runs/x", "--config.rl.n=8",
                   PASS_ENV="WANDB_API_KEY", WANDB_API_KEY="k 1'2", JAX_LOG_COMPILES="1", **SLICE)
  assert run[4] == "ssh" and "--worker=all" in run
  remote = shlex.split(run[run.index("--command") + 1])
  assert remote[:2] == ["cd", "~/agentrl_jax"]
  env = remote[remote.index("env") + 1:remote.index("nohup")]
  assert set(env) == {"WANDB_API_KEY=k 1'2", "JAX_LOG_COMPILES=1", "AGENTRL_DISTRIBUTED=1"}
  assert "--config=configs/demystify_qwen3_4b.py" in remote and "--workdir=gs://b/runs/x" in remote
  assert "--config.rl.n=8" in remote

  (delete,) = dry_run("delete", **SLICE)
  assert delete[4:6] == ["delete", "rl-slice"] and "--quiet" in delete


def test_logs_copy_and_placeholders():
  (logs,) = dry_run("logs", "20", **SLICE)
  assert "--worker=all" in logs and logs[-1] == "tail -n 20 ~/agentrl_jax/run.log"
  (copy,) = dry_run("copy", "/data/eval", "data", **SLICE)
  assert copy[4] == "scp" and "--recurse" in copy and "rl-slice:~/data/" in copy and "--worker=all" in copy
  (create,) = dry_run("create")  # nothing set: placeholders instead of an error
  assert "<TPU_NAME>" in create and "<ACCELERATOR>" in create


def test_without_dry_run_a_missing_variable_is_an_error():
  out = subprocess.run(["bash", "launch/tpu_vm.sh", "create"], cwd=REPO, env={"PATH": "/usr/bin:/bin"},
                       capture_output=True, text=True, timeout=30)
  assert out.returncode == 2 and "set TPU_NAME" in out.stderr


def test_preflight_compiles_for_the_topology_before_a_run():
  """`preflight` (and `run` with TOPOLOGY set, before anything starts on the slice) runs the ahead-of-time
  check on this machine: `python -m agentrl_jax.aot` for the topology, on the CPU backend."""
  (pre,) = dry_run("preflight", "configs/demystify_qwen3_4b.py", "--config.rollout.batch_size=128",
                   TOPOLOGY="v5p:2x2x2")
  assert pre[:2] == ["env", "JAX_PLATFORMS=cpu"] and pre[3:5] == ["-m", "agentrl_jax.aot"]
  assert pre[5:] == ["--config=configs/demystify_qwen3_4b.py", "--topology=v5p:2x2x2",
                     "--config.rollout.batch_size=128"]
  pre, run = dry_run("run", "configs/demystify_qwen3_4b.py", "gs://b/runs/x", TOPOLOGY="v5p:2x2x2", **SLICE)
  assert "agentrl_jax.aot" in pre and run[4] == "ssh"
  (run,) = dry_run("run", "configs/demystify_qwen3_4b.py", "gs://b/runs/x", **SLICE)  # no TOPOLOGY: no preflight
  assert run[4] == "ssh"


def test_a_slice_family_argument_preflights_its_slice():
  """`configs/x.py:v5e` (the recipe laid out for a v5e-16) runs the pre-flight for v5e:4x4 before a run without
  TOPOLOGY; an explicit TOPOLOGY wins."""
  pre, run = dry_run("run", "configs/demystify_qwen3_4b.py:v5e", "gs://b/runs/x", **SLICE)
  assert pre[5:7] == ["--config=configs/demystify_qwen3_4b.py:v5e", "--topology=v5e:4x4"] and run[4] == "ssh"
  assert "--config=configs/demystify_qwen3_4b.py:v5e" in run[-1]
  (pre,) = dry_run("preflight", "configs/demystify_qwen2p5_7b.py:v6e")
  assert pre[6] == "--topology=v6e:4x4"
  (pre,) = dry_run("preflight", "configs/demystify_qwen3_4b.py:v6e", TOPOLOGY="v6e:8x8")
  assert pre[6] == "--topology=v6e:8x8"
