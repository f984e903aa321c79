"""Set-up shared by the jobs that sample a policy with the tool loop: evaluation, trajectory collection and
model-aware prompt filtering.

    job = jobs.sampling_job(config, temperature=1.0, top_p=1.0)   # policy, executor, rollout engine
    with job:                                                       # closes the executor
      records = jobs.load_prompts(config, workdir)
      prompts = job.engine.render(records.styled)
      episodes, stats = job.engine.run(job.params, prompts.ids, n=8, key=job.sample_key)

Every job reads the same config blocks (`agentrl_jax/rl/recipe.py`): `model`, `mesh`, `rollout`, `tools`,
`reward`, `data`, `prompt_style`, and `seed`.
"""

from __future__ import annotations

import dataclasses
import logging
import os

from flax import nnx
import jax
import ml_collections

from agentrl_jax import checkpoint as ckpt_lib
from agentrl_jax import data, multihost, rewards
from agentrl_jax.data.records import PromptRecord
from agentrl_jax.models import sharding as sharding_lib
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.rollout import engine as engine_lib
from agentrl_jax.tasks import tokenizer as embedded_tokenizer
from agentrl_jax.tools import base as tools_base
from agentrl_jax.tools import executors as tool_executors

log = logging.getLogger(__name__)

# Outcome scoring only (evaluation, collection, filtering): no overlong penalty, no tool-call shaping.
OUTCOME_ONLY = rewards.ShapingConfig(max_response_tokens=1, overlong_buffer_tokens=0, tool_call_bonus=0.0)


@dataclasses.dataclass
class SamplingJob:
  """A policy ready to sample episodes with real tool execution.

  Attributes:
    mesh: the device mesh of `config.mesh`.
    tokenizer: the policy's tokenizer (chat template included).
    model_cfg: the policy's `ModelConfig`.
    params: the policy's params, placed in their shardings.
    executor: the code tool's executor (close it: `close()` or a `with` block).
    engine: the rollout engine (sampler compiled for `config.rollout`).
    sample_key: the PRNG key for sampling (the root key's second split; the first initialises random weights).
  """

  mesh: jax.sharding.Mesh
  tokenizer: object
  model_cfg: ModelConfig
  params: nnx.State
  executor: tools_base.PoolExecutor
  engine: engine_lib.RolloutEngine
  sample_key: jax.Array

  def close(self) -> None:
    self.executor.close()

  def __enter__(self) -> SamplingJob:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def sampling_job(config: ml_collections.ConfigDict, *, temperature: float, top_p: float = 1.0,
                 top_k: int = 0) -> SamplingJob:
  """Loads the policy of `config.model` on the mesh of `config.mesh`, starts the executor of `config.tools` and
  builds a rollout engine for `config.rollout`.

  Args:
    config: a job config with the blocks named in the module docstring.
    temperature: sampling temperature; 0 means greedy decoding.
    top_p: nucleus sampling threshold (ignored when greedy).
    top_k: top-k sampling (0 = off; ignored when greedy).
  """
  if temperature < 0:
    raise ValueError(f"sampling_job: temperature must be >= 0 (0 = greedy), got {temperature}")
  root = jax.random.key(config.seed)
  init_key, sample_key = jax.random.split(root)
  mesh = sharding_lib.mesh_from_config(config.mesh)
  tokenizer, model = ckpt_lib.load_policy(embedded_tokenizer.fill_model_block(config.model), mesh, init_key)
  graphdef, params = nnx.split(model)
  executor = tool_executors.make_executor(engine_lib.tool_config(config.tools))
  try:
    greedy = temperature == 0
    engine = engine_lib.RolloutEngine.create(
        graphdef, model.cfg, tokenizer, executor, engine_lib.rollout_config(config.rollout),
        temperature=1.0 if greedy else temperature, top_p=top_p, top_k=top_k, greedy=greedy,
        advertise_tools=config.rollout.advertise_tools, mesh=mesh, params=params)
  except BaseException:
    executor.close()
    raise
  return SamplingJob(mesh=mesh, tokenizer=tokenizer, model_cfg=model.cfg, params=params, executor=executor,
                     engine=engine, sample_key=sample_key)


def reward_config(block: ml_collections.ConfigDict) -> rewards.RewardConfig:
  """`RewardConfig` from a config's `reward` block (`math_mode`, and extra `[data_source, kind]` pairs)."""
  import agentrl_jax.tasks  # noqa: F401  (the embedded tasks' reward kinds must be registered first)

  return rewards.RewardConfig(math_mode=block.math_mode, sources=tuple(tuple(s) for s in block.get("sources", ())))


def prompt_style(block: ml_collections.ConfigDict | None) -> data.PromptStyle:
  """`data.PromptStyle` from a config's `prompt_style` block: extra `(substring, template)` rules first."""
  if block is None:
    return data.PromptStyle()
  rules = tuple(tuple(r) for r in block.get("extra_rules", ())) + data.PromptStyle().rules
  return data.PromptStyle(rules=rules, default=block.get("default", "math_units"))


def prompt_file(config: ml_collections.ConfigDict, workdir: str) -> str:
  """The prompt file of a job: `data.train_path`, or an embedded task written into the workdir: `data.toy_task`
  "arithmetic" (`data.toy_problems` problems of `data.toy_levels`, seeded by `config.seed`) or "digits" (the
  RL sanity task)."""
  if config.data.train_path:
    return config.data.train_path
  if not config.data.get("toy_problems"):
    raise ValueError("config.data.train_path is empty and config.data.toy_problems is 0: no prompts")
  from agentrl_jax.tasks import arithmetic, digits

  task = config.data.get("toy_task", "arithmetic")
  path = os.path.join(workdir, f"toy_{task}.parquet")
  if os.path.exists(path):
    return path
  if task == "arithmetic":
    problems = arithmetic.make_problems(config.data.toy_problems, levels=tuple(config.data.toy_levels),
                                        seed=config.seed)
    arithmetic.write_rl_parquet(path, problems)
  elif task == "digits":
    digits.write_rl_parquet(path, config.data.toy_problems)
  else:
    raise ValueError(f"config.data.toy_task: unknown {task!r} (arithmetic, digits)")
  return path


@dataclasses.dataclass(frozen=True)
class Prompts:
  """The records of a prompt file, as stored (`raw`) and with the per-source wording applied (`styled`, what
  the policy sees); aligned, in file order."""

  raw: list[PromptRecord]
  styled: list[PromptRecord]
  path: str
  num_skipped: int


def load_prompts(config: ml_collections.ConfigDict, workdir: str, *, limit: int = 0, path: str = "") -> Prompts:
  """Builds (once, cached under `data.data_dir` or `workdir/tfds`) and reads the job's prompt file.

  Args:
    config: reads `data.train_path` / `data.train_schema` (any prompt schema: rl, aime2024, gpqa_diamond, ...),
      `data.skip_malformed`, `data.data_dir` and `prompt_style`.
    workdir: the job's directory (the toy task and the built dataset go there by default).
    limit: the first `limit` records only (0 = all).
    path: read this file (in `data.train_schema`) instead of `prompt_file(config, workdir)`.
  """
  # Several processes: process 0 builds the files in the workdir, then every process opens them.
  path = path or multihost.primary_first("prompt_file", lambda: prompt_file(config, workdir))
  prepared = multihost.primary_first("prompts", lambda: data.prepare(data.SourceConfig(
      path=path, schema=config.data.train_schema, data_dir=config.data.data_dir or os.path.join(workdir, "tfds"),
      skip_malformed=config.data.skip_malformed)))
  if "reward" in config:  # a source no reward handles is refused before any sampling (file and row named)
    reward_cfg = reward_config(config.reward)
    data.refuse_unknown_sources(prepared, lambda source: rewards.kind_for(source, reward_cfg))
  raw = data.all_prompt_records(prepared.data_source, None, limit=limit or None)
  style = prompt_style(config.get("prompt_style"))
  styled = [data.apply_prompt_style(r, style) for r in raw]
  log.info("prompts: %d records from %s (%d malformed rows skipped)", len(raw), path, prepared.num_skipped)
  return Prompts(raw=raw, styled=styled, path=path, num_skipped=prepared.num_skipped)
