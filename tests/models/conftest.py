import pytest

from agentrl_jax import testing
from agentrl_jax.models.config import ModelConfig

CONFIGS = {"qwen3": ModelConfig.tiny_qwen3(), "qwen2": ModelConfig.tiny_qwen2()}


@pytest.fixture(scope="session", params=sorted(CONFIGS))
def hf_checkpoint(request, tmp_path_factory):
  """(config, directory) of a random-weight HF checkpoint saved by transformers, per family."""
  cfg = CONFIGS[request.param]
  path = tmp_path_factory.mktemp(f"hf_{request.param}")
  testing.save_random_hf_checkpoint(cfg, path, seed=1)
  return cfg, str(path)
