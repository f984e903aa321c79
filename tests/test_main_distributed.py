"""main.py's multi-process arguments: flags over environment, nothing for one process, clear errors."""

from absl import app
import pytest

from agentrl_jax.main import distributed_args


def test_single_process_initialises_nothing():
  assert distributed_args(None, None, None, {}) is None
  assert distributed_args(None, 1, 0, {"JAX_COORDINATOR_ADDRESS": "h:1"}) is None


def test_flags_win_over_the_environment():
  env = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3"}
  assert distributed_args(None, None, None, env) == {"coordinator_address": "10.0.0.1:1234", "num_processes": 4,
                                                     "process_id": 3}
  assert distributed_args("127.0.0.1:9", 2, 1, env) == {"coordinator_address": "127.0.0.1:9", "num_processes": 2,
                                                        "process_id": 1}
  assert distributed_args(None, None, None, {"AGENTRL_DISTRIBUTED": "1"}) == {}  # TPU: JAX finds the rest


@pytest.mark.parametrize("coordinator,num,pid", [(None, 2, 0), ("h:1", 2, 2), ("h:1", 2, -1)])
def test_incomplete_settings_are_refused(coordinator, num, pid):
  with pytest.raises(app.UsageError, match="coordinator_address"):
    distributed_args(coordinator, num, pid, {})
