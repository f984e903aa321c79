"""Smoke runs of the sampler and rollout benchmarks at a tiny size (~10 s each; the real runs are in their
docstrings). The sampler smoke includes Tunix when .venv-tunix exists."""

import contextlib
import io
import json

from agentrl_jax.bench import common
from agentrl_jax.bench import rollout as bench_rollout
from agentrl_jax.bench import sampler as bench_sampler


def _json_lines(main, argv):
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    main(argv)
  return [json.loads(line) for line in out.getvalue().splitlines() if line.startswith("{")]


def test_sampler_bench_smoke():
  argv = ["--sizes", "tiny_qwen3", "--new-tokens", "8", "--prompt-len", "8", "--batch", "4", "--segment-len", "8",
          "--rounds", "1", "--repeats", "1", "--matmul-n", "256", "--mem-mb", "32"]
  if common.tunix_python() is None:
    argv.append("--no-tunix")
  (line,) = _json_lines(bench_sampler.main, argv)
  assert line["bench"] == "sampler" and line["size"] == "tiny_qwen3"
  for key in ("ours_tok_s", "hf_tok_s", "roofline_frac", "xla_step_floor_ms", "roofline_frac_at_step_floor"):
    assert line[key] > 0, key
  assert line["tunix_tok_s"] is None or line["tunix_tok_s"] > 0


def test_sampler_ideal_counts_the_bytes_a_step_reads():
  """Memory-bound ideal (infinite peak, 1 byte/s): an untied input table is not read, only B of its rows."""
  from agentrl_jax.models.config import ModelConfig

  cfg = ModelConfig.bench_5m()
  b, plen, new = 4, 8, 3
  weights = 4.0 * (cfg.param_count() - cfg.vocab_size * cfg.hidden_size + b * cfg.hidden_size)
  kv_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4.0
  want = weights + sum(weights + b * (plen + step) * kv_per_token for step in range(1, new))
  assert bench_sampler.ideal_seconds(cfg, b, plen, new, peak=1e30, bw=1.0) == want


def test_rollout_bench_smoke():
  argv = ["--size", "tiny_qwen3", "--groups", "2", "--n", "2", "--tool-turns", "2", "--rounds", "1",
          "--tool-latency", "0.01", "--segment-len", "16"]
  (line,) = _json_lines(bench_rollout.main, argv)
  assert line["bench"] == "rollout" and line["episodes"] == 4
  assert line["transcripts_match"]
  assert line["prefilled_tokens"] == line["expected_prefill_tokens"]
  assert line["reprefill_prefilled_tokens"] > line["prefilled_tokens"]
  assert line["ours_episodes_s"] > 0 and line["reprefill_episodes_s"] > 0
