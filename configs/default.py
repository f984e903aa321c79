"""The embedded CPU default run by `bash launch/local.sh`.

Run: python -m agentrl_jax.main --config=configs/default.py --workdir=runs/local

For now this is the smoke job (tiny model + tiny tokenizer built locally, a chat prompt rendered with the tool
schema, prefill + cached greedy decode); the embedded end-to-end agentic RL demo replaces it once it exists.
"""

import ml_collections


def get_config(arg=None):
  del arg
  config = ml_collections.ConfigDict()
  config.job = "smoke"
  config.seed = 0
  config.model = ml_collections.ConfigDict(dict(size="tiny_qwen3", hf_path="", tokenizer_path=""))
  config.prompt = "What is 17 * 23? Use the code tool."
  config.max_new_tokens = 16
  config.lock()
  return config
