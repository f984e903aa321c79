"""`python -m agentrl_jax.aot --config=configs/<x>.py[:arg] --topology=v5p:2x2x2 [--json] [--config.a.b=...]`."""

from absl import app

from agentrl_jax.aot import report

if __name__ == "__main__":
  app.run(report.absl_main, flags_parser=report.parse_flags)
