"""A rollout engine: tokenizer + compiled sampler + executor + limits, for jobs that sample episodes.

The RL trainer, the evaluation runner, trajectory collection and prompt filtering all turn `PromptRecord`s into
episodes the same way; this is that one way:

    engine = RolloutEngine.create(graphdef, model_cfg, tokenizer, executor, rollout_cfg, sampling, mesh=mesh,
                                  params=params)
    prompts = engine.render(records)                 # chat template + tool schema; overlong prompts reported
    episodes, stats = engine.run(params, prompts.ids, n=16, key=key)
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence

from flax import nnx
import jax
import ml_collections

from agentrl_jax.data.records import PromptRecord
from agentrl_jax.models import tokenizer as tok_lib
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.rollout import agent_loop, shapes
from agentrl_jax.rollout.config import RolloutConfig
from agentrl_jax.rollout.episode import Episode
from agentrl_jax.sampling import sampler as sampler_lib
from agentrl_jax.tools import base as tools_base
from agentrl_jax.tools.code_interpreter import TOOL_SCHEMA

log = logging.getLogger(__name__)


@dataclasses.dataclass
class RenderedPrompts:
  """Prompts ready for the sampler.

  Attributes:
    ids: token ids of each kept prompt (chat-rendered up to the assistant header).
    records: the kept records, aligned with `ids`.
    skipped: `(record index, reason)` of prompts that were dropped (too long for `max_prompt_len`).
  """

  ids: list[list[int]]
  records: list[PromptRecord]
  skipped: list[tuple[int, str]]


@dataclasses.dataclass
class RolloutEngine:
  """Everything needed to sample episodes from the current params (see module docstring)."""

  tokenizer: object
  model_cfg: ModelConfig
  sampler: sampler_lib.Sampler
  executor: object
  cfg: RolloutConfig
  tools: list[dict] | None

  @classmethod
  def create(cls, graphdef: nnx.GraphDef, model_cfg: ModelConfig, tokenizer, executor, cfg: RolloutConfig, *,
             temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, greedy: bool = False,
             advertise_tools: bool = True, mesh: jax.sharding.Mesh | None = None,
             params: nnx.State | None = None) -> RolloutEngine:
    sampling = shapes.sampling_config(tokenizer, cfg, temperature=temperature, top_p=top_p, top_k=top_k,
                                      greedy=greedy)
    sampler = sampler_lib.make_sampler(graphdef, model_cfg, sampling, batch=cfg.batch_size, mesh=mesh, params=params)
    return cls(tokenizer=tokenizer, model_cfg=model_cfg, sampler=sampler, executor=executor, cfg=cfg,
               tools=[TOOL_SCHEMA] if advertise_tools else None)

  def render(self, records: Sequence[PromptRecord]) -> RenderedPrompts:
    """Chat-renders records (with the tool schema when advertised); drops and reports over-long prompts."""
    out = RenderedPrompts([], [], [])
    for rec in records:
      text = tok_lib.render_chat(self.tokenizer, rec.prompt, tools=self.tools, add_generation_prompt=True)
      ids = self.tokenizer.encode(text, add_special_tokens=False)
      if len(ids) > self.cfg.max_prompt_len:
        out.skipped.append((rec.index, f"prompt has {len(ids)} tokens > max_prompt_len {self.cfg.max_prompt_len}"))
        continue
      out.ids.append(ids)
      out.records.append(rec)
    for index, reason in out.skipped:
      log.warning("rollout: skipping prompt of row %d (%s)", index, reason)
    return out

  def run(self, params: nnx.State, prompt_ids: Sequence[Sequence[int]], *, n: int, key: jax.Array,
          on_episode: Callable[[Episode], None] | None = None) -> tuple[list[Episode], agent_loop.RolloutStats]:
    """n episodes per prompt, ordered by (prompt, sample); reads `params` directly (resharded if needed).
    `on_episode` is called as each episode finishes (progress bars)."""
    return agent_loop.run_rollout(self.sampler, self.sampler.place_params(params), prompt_ids, n=n,
                                  tokenizer=self.tokenizer, executor=self.executor, cfg=self.cfg, key=key,
                                  on_episode=on_episode)


# Fields of a config's `rollout` block that are not RolloutConfig's: sampling settings and the prompt rendering.
_ENGINE_FIELDS = ("temperature", "top_p", "top_k", "advertise_tools")


def rollout_config(block: ml_collections.ConfigDict, **overrides) -> RolloutConfig:
  """`RolloutConfig` from a config's `rollout` block (fields the block does not set keep their defaults).

  Raises:
    ValueError: the block has a field neither RolloutConfig nor the engine knows (a renamed or misspelt
      setting would otherwise be ignored silently).
  """
  fields = {f.name for f in dataclasses.fields(RolloutConfig)}
  unknown = sorted(set(block.keys()) - fields - set(_ENGINE_FIELDS))
  if unknown:
    raise ValueError(f"config.rollout: unknown fields {unknown} (RolloutConfig has {sorted(fields)})")
  kw = {k: v for k, v in block.items() if k in fields}
  kw = {k: tuple(v) if isinstance(v, list) else v for k, v in kw.items()}
  kw.update(overrides)
  return RolloutConfig(**kw)


def tool_config(block: ml_collections.ConfigDict) -> tools_base.ToolConfig:
  """`ToolConfig` from a config's `tools` block; `max_concurrency: 0` means one worker per core."""
  kw = dict(block)
  kw["max_concurrency"] = kw.get("max_concurrency") or None
  return tools_base.ToolConfig(**kw)
