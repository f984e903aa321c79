"""The train state SFT and RL share: optimizer config validation and schedules."""

import pytest

from agentrl_jax import train_state


@pytest.mark.parametrize("field,value", [("learning_rate", -1.0), ("b2", 1.0), ("grad_clip", 0.0),
                                         ("schedule", "linear"), ("warmup_steps", -1), ("eps", float("nan"))])
def test_optimizer_config_validation_names_field(field, value):
  with pytest.raises(ValueError, match=field):
    train_state.OptimizerConfig(**{field: value})


def test_cosine_schedule():
  with pytest.raises(ValueError, match="total_steps"):
    train_state.OptimizerConfig(schedule="cosine")
  sched = train_state.OptimizerConfig(learning_rate=1.0, schedule="cosine", warmup_steps=10, total_steps=110,
                                      min_lr_ratio=0.1).make_schedule()
  assert float(sched(0)) == 0.0 and float(sched(5)) == pytest.approx(0.5)
  assert float(sched(10)) == pytest.approx(1.0) and float(sched(110)) == pytest.approx(0.1)
  assert float(train_state.OptimizerConfig().make_schedule()(1000)) == pytest.approx(1e-6)
