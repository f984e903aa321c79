"""The prepared accelerator benchmark at a tiny size on the CPU: both parts run and print consistent fields; the
chip table and the decode roofline's byte count are checked by hand."""

import jax
import pytest

from agentrl_jax.bench import device
from agentrl_jax.models.config import ModelConfig


def test_chip_table():
  assert device.chip_specs("NVIDIA H200") == (989e12, 4.8e12)
  assert device.chip_specs("TPU v5 lite") == (197e12, 0.819e12)
  assert device.chip_specs("TPU v5p")[0] == 459e12 and device.chip_specs("TPU v6 lite")[0] == 918e12
  assert device.chip_specs("cpu") == (None, None)


def test_decode_bytes_by_hand():
  cfg = ModelConfig.tiny_qwen3(vocab_size=512, param_dtype="bfloat16", dtype="bfloat16")
  # matmul weights (tied table counted once, as the LM head; norms excluded), 2 bytes each
  layer = 64 * 4 * 16 + 2 * 64 * 2 * 16 + 4 * 16 * 64 + 3 * 64 * 128
  weights = 2 * (2 * layer + 512 * 64)
  kv = 2 * 2 * 2 * 16 * 2 * 3 * 10  # K and V, 2 layers, 2 kv heads, head_dim 16, bf16, 3 rows x 10 tokens
  assert device.decode_bytes(cfg, rows=3, context=10) == weights + kv


def test_tiny_run_prints_both_parts(capsys):
  out = device.main(["--smoke"])
  sampler, update = out
  assert sampler["part"] == "sampler" and update["part"] == "update"
  assert sampler["tok_s"] == pytest.approx(4 / (sampler["step_ms"] / 1e3), rel=1e-9)
  assert update["tok_s"] == pytest.approx(2 * 32 / update["step_s"], rel=1e-9)
  assert sampler["mfu"] is None and sampler["roofline_frac"] is None  # no chip peak known for a CPU
  assert sampler["attention"] == "xla" and update["device_kind"] == "cpu"
  for part in out:  # compile work of the first call, from JAX's compile events
    assert part["compiled_programs"] > 0 and 0 < part["compile_s"] < part["first_call_s"]
    assert 0 <= part["compile_cache_hits"] <= part["compiled_programs"]  # the tests' persistent cache may serve some
    # against the ceilings measured in the run (no datasheet for a CPU)
    assert part["measured_matmul_flops"] > 0 and part["measured_copy_bytes_s"] > 0 and part["mfu_measured_peak"] > 0
    assert part["jax"] == jax.__version__
  assert sampler["roofline_frac_measured_bw"] > 0
  assert len(capsys.readouterr().out.strip().splitlines()) == 2
