"""`python -m agentrl_jax.aot --config=configs/<x>.py[:arg] --topology=v5p:2x2x2 [--json] [--only=...] [--profile]
[--config.a.b=...]`.

The flags live here, not in `report`, so that importing the package beside `agentrl_jax.main` (which defines
its own `--config`) never defines a flag twice."""

import logging
import sys

from absl import app, flags
from ml_collections import config_flags

from agentrl_jax.aot import report

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/*.py[:arg]).",
                                          lock_config=True)
_TOPOLOGY = flags.DEFINE_string("topology", "v5p:2x2x2", "TPU slice: v5e:2x4, v5p:2x2x2, v6e:4x4, ...")
_JSON = flags.DEFINE_bool("json", False, "Print one JSON object instead of the table.")
_PROFILE = flags.DEFINE_bool("profile", False, "Also list each program's TPU-compiler phases by time (aot.profile).")
_ONLY = flags.DEFINE_list("only", [], "Compile only programs whose name contains one of these (e.g. update,decode).")


def _main(argv):
  if len(argv) > 1:
    raise flags.Error(f"unexpected arguments: {argv[1:]}")
  if _CONFIG.value is None:
    raise flags.Error("--config is required, e.g. --config=configs/demystify_qwen3_4b.py")
  logging.getLogger().setLevel(logging.WARNING)
  try:
    code = report.main(_CONFIG.value, _TOPOLOGY.value, as_json=_JSON.value, only=_ONLY.value, profile=_PROFILE.value)
  except ValueError as e:  # an unknown topology or job, a config the programs cannot be built for
    print(str(e) if str(e).startswith("aot:") else f"aot: {e}", file=sys.stderr)
    code = 2
  sys.exit(code)


if __name__ == "__main__":
  app.run(_main)
