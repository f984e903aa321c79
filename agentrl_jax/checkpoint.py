"""Orbax checkpoints shared by the SFT and RL trainers: save, exact resume, keep the last N, export to HF.

One checkpoint per step holds three items:

* `state`: any pytree of arrays (params, optimizer state, step, PRNG keys), restored straight into the target
  shardings you pass (an abstract pytree of `jax.ShapeDtypeStruct`s with `.sharding`, or live arrays);
* `data`: the grain iterator's position (`grain.checkpoint.CheckpointSave`; one file per JAX process);
* `meta`: small JSON metadata (counters, the model config for export, ...).

    ckpt = Checkpointer(workdir + "/checkpoints", CheckpointConfig(every_steps=100, max_to_keep=3))
    if (step := ckpt.latest_step()) is not None:
      state, meta = ckpt.restore(abstract_state(state), data_iterator=it)  # `it` continues where it stopped
    ...
    ckpt.maybe_save(step, state, data_iterator=it, metadata={"model_config": ...})
    ckpt.close()

Typed PRNG keys (`jax.random.key`) are stored as their raw key data and re-wrapped on restore. Checkpoints written
before the decoder layers were stacked (params and Adam moments as `layers/0/...`, `layers/1/...`) restore
into the stacked layout (`layers/...` with a leading layer axis): the layers are read one by one in their
sharding and stacked on device.
A checkpoint becomes visible to `latest_step()` only once Orbax has committed it (atomic rename), so a process
killed mid-save leaves the previous checkpoint as the latest one.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

import grain
import jax
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """When and how checkpoints are written.

  Attributes:
    every_steps: save when `step % every_steps == 0` (and whenever `force=True`, e.g. the final step).
    max_to_keep: keep the newest N checkpoints; older ones are deleted.
    async_save: write in a background thread (device->host copies still happen before `save` returns, so
      donating the saved buffers afterwards is safe). Off by default: on CPU it buys little.
  """

  every_steps: int = 1000
  max_to_keep: int = 3
  async_save: bool = False

  def __post_init__(self):
    if self.every_steps < 1:
      raise ValueError(f"CheckpointConfig.every_steps must be >= 1, got {self.every_steps}")
    if self.max_to_keep < 1:
      raise ValueError(f"CheckpointConfig.max_to_keep must be >= 1, got {self.max_to_keep}")


def _is_key(x: Any) -> bool:
  return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _key_data_sharding(sharding):
  # Key data has one trailing dimension more than the key array.
  if isinstance(sharding, jax.sharding.NamedSharding):
    return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(*sharding.spec, None))
  return sharding


def abstract_state(tree: Any, shardings: Any = None) -> Any:
  """The restore target for `tree`: `ShapeDtypeStruct`s carrying the target shardings.

  Args:
    tree: live arrays or `ShapeDtypeStruct`s (e.g. from `jax.eval_shape`).
    shardings: a matching pytree of shardings; default each leaf's own `.sharding`.
  """
  if shardings is None:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
                        tree)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def _to_storable(state: Any) -> Any:
  return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, state)


def _storable_target(target: Any) -> Any:
  def one(x):
    sharding = getattr(x, "sharding", None)
    if _is_key(x):
      data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(x.shape, x.dtype))
      return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=_key_data_sharding(sharding))
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

  return jax.tree.map(one, target)


def _from_storable(restored: Any, target: Any) -> Any:
  def one(x, t):
    if not _is_key(t):
      return x
    # key_impl wants a concrete key; an abstract target only carries the impl in its dtype.
    impl = jax.random.key_impl(t) if isinstance(t, jax.Array) else t.dtype._impl  # pylint: disable=protected-access
    return jax.random.wrap_key_data(x, impl=impl)

  return jax.tree.map(one, restored, target)


def _has_unstacked_layers(tree: Any) -> bool:
  """Whether a stored tree (nested dicts) holds decoder layers one subtree per layer (`layers/0`, ...)."""
  if not isinstance(tree, dict):
    return False
  layers = tree.get("layers")
  if isinstance(layers, dict) and layers and all(str(k).isdigit() for k in layers):
    return True
  return any(_has_unstacked_layers(v) for v in tree.values())


def _is_layered_state(x: Any) -> bool:
  from flax import nnx

  return isinstance(x, nnx.State) and "layers" in x


def _unstacked_target(target: Any) -> Any:
  """`target` with every stacked `layers` subtree of an nnx State (params, Adam moments) split into one abstract
  subtree per layer, each in its stacked parameter's sharding without the (unsharded) layer axis."""
  from flax import nnx

  def per_layer(x, i):
    spec = tuple(x.sharding.spec) if isinstance(x.sharding, jax.sharding.NamedSharding) else ()
    sharding = (jax.sharding.NamedSharding(x.sharding.mesh, jax.sharding.PartitionSpec(*spec[1:]))
                if isinstance(x.sharding, jax.sharding.NamedSharding) else x.sharding)
    return jax.ShapeDtypeStruct(x.shape[1:], x.dtype, sharding=sharding)

  def one(state):
    if not _is_layered_state(state):
      return state
    stacked = state["layers"]
    num_layers = jax.tree.leaves(stacked)[0].shape[0]
    layers = {i: jax.tree.map(lambda x, i=i: per_layer(x, i), stacked).raw_mapping for i in range(num_layers)}
    return nnx.State({**state.raw_mapping, "layers": layers})  # nested levels as plain dicts, as nnx stores them

  return jax.tree.map(one, target, is_leaf=_is_layered_state)


def _lookup(tree: Any, path: tuple) -> Any:
  """The leaf at a key path of the target, in a restored tree whose containers may be plain dicts."""
  for key in path:
    name = getattr(key, "key", getattr(key, "name", None))
    if isinstance(tree, dict) or hasattr(tree, "__getitem__") and not hasattr(tree, "get_value"):
      tree = tree[name]
    else:
      tree = getattr(tree, name)
  return tree


def _stack_layers(restored: Any, target: Any) -> Any:
  """Inverse of `_unstacked_target` on restored arrays: each `layers` subtree stacked on device into the
  target's sharding."""
  from flax import nnx

  def one(got, want):
    if not _is_layered_state(want):
      return got
    parts = [got["layers"][i] for i in range(len(got["layers"]))]
    paths, treedef = jax.tree_util.tree_flatten_with_path(want.raw_mapping["layers"])
    stacked = []
    for path, w in paths:  # restored containers may be dicts where the target has States and Variables
      xs = [_lookup(part, path) for part in parts]
      stacked.append(jax.jit(lambda *a: jax.numpy.stack(a), out_shardings=w.sharding)(*xs))
    return nnx.State({**got.raw_mapping, "layers": jax.tree.unflatten(treedef, stacked)})

  return jax.tree.map(one, restored, target, is_leaf=_is_layered_state)


class Checkpointer:
  """An Orbax `CheckpointManager` for one train-state pytree, a grain iterator and JSON metadata."""

  def __init__(self, directory: str | os.PathLike, config: CheckpointConfig = CheckpointConfig()):
    self.directory = os.path.abspath(os.fspath(directory))
    self.config = config
    # cleanup_tmp_directories: a process killed mid-save leaves `<step>.orbax-checkpoint-tmp`; the restarted
    # run removes it before it saves that step again.
    options = ocp.CheckpointManagerOptions(max_to_keep=config.max_to_keep, create=True,
                                           enable_async_checkpointing=config.async_save,
                                           cleanup_tmp_directories=True)
    # Handlers named up front, so a fresh process can read metadata before it has restored anything.
    handlers = {"state": ocp.PyTreeCheckpointHandler(), "meta": ocp.JsonCheckpointHandler(),
                "data": grain.checkpoint.CheckpointHandler()}
    self._mngr = ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)

  # ---------------------------------------------------------------- queries
  def latest_step(self) -> int | None:
    """The newest committed checkpoint's step, or None when there is none."""
    return self._mngr.latest_step()

  def all_steps(self) -> list[int]:
    return sorted(self._mngr.all_steps())

  def read_metadata(self, step: int | None = None) -> dict[str, Any]:
    """The JSON metadata of checkpoint `step` (default the latest), without reading any array."""
    step = self._existing(step)
    return dict(self._mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta)

  def saved_shapes(self, step: int | None = None) -> Any:
    """The stored state as a pytree of `ShapeDtypeStruct`s (containers as stored: dicts and lists; nnx
    Variables appear as `{"value": ...}`), e.g. to load a checkpoint for analysis without the training code:
    `ckpt.restore(abstract_state(shapes, jax.tree.map(lambda _: device, shapes)))`."""
    tree = self._mngr.item_metadata(self._existing(step)).state.tree
    return jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), tree)

  def _existing(self, step: int | None) -> int:
    step = self.latest_step() if step is None else step
    if step is None or step not in self._mngr.all_steps():
      raise ValueError(f"{self.directory}: no checkpoint at step {step} (have {self.all_steps()})")
    return step

  def should_save(self, step: int) -> bool:
    return step % self.config.every_steps == 0

  # ---------------------------------------------------------------- save
  def save(self, step: int, state: Any, *, data_iterator: grain.DatasetIterator | None = None,
           metadata: dict[str, Any] | None = None) -> None:
    """Writes checkpoint `step` (blocks until written unless `async_save`).

    Args:
      step: the number of completed training steps the state reflects.
      state: pytree of arrays (any shardings; typed PRNG keys allowed).
      data_iterator: a grain iterator, saved at its current position.
      metadata: JSON-able dict stored next to the arrays (`step` is added).
    """
    items = {"state": ocp.args.PyTreeSave(_to_storable(state)),
             "meta": ocp.args.JsonSave({**(metadata or {}), "step": int(step)})}
    if data_iterator is not None:
      items["data"] = grain.checkpoint.CheckpointSave(data_iterator)
    self._mngr.save(step, args=ocp.args.Composite(**items), force=True)
    if not self.config.async_save:
      self._mngr.wait_until_finished()
    log.info("saved checkpoint at step %d in %s", step, self.directory)

  def maybe_save(self, step: int, state: Any, *, force: bool = False, **kwargs) -> bool:
    """`save` if `step` is due (every `every_steps`) or `force`; returns whether it saved."""
    if not (force or self.should_save(step)) or step in self._mngr.all_steps():
      return False
    self.save(step, state, **kwargs)
    return True

  # ---------------------------------------------------------------- restore
  def restore(self, target: Any, *, step: int | None = None,
              data_iterator: grain.DatasetIterator | None = None) -> tuple[Any, dict[str, Any]]:
    """Restores checkpoint `step` (default the latest) into `target`'s structure, dtypes and shardings.

    Args:
      target: pytree like the saved state: `ShapeDtypeStruct`s with `.sharding` (see `abstract_state`) or
        live arrays (their shardings are used). A subtree of dicts restores only that part (e.g.
        `{"params": ...}`), reading nothing else from disk.
      step: which checkpoint; default `latest_step()`.
      data_iterator: a fresh grain iterator of the same pipeline; set to the saved position in place.

    Returns:
      `(state, metadata)`.

    Raises:
      ValueError: no checkpoint (at `step`), or the checkpoint has no iterator state but one was asked for.
    """
    step = self._existing(step)
    storable = _storable_target(target)
    unstacked = _has_unstacked_layers(self._mngr.item_metadata(step).state.tree)
    if unstacked:
      log.info("checkpoint %d stores the decoder layers one by one: stacking them on restore", step)
      storable = _unstacked_target(storable)
    items = {"state": ocp.args.PyTreeRestore(storable, restore_args=ocp.checkpoint_utils.construct_restore_args(
                 storable), partial_restore=True),
             "meta": ocp.args.JsonRestore()}
    if data_iterator is not None:
      if not os.path.isdir(os.path.join(self.directory, str(step), "data")):
        raise ValueError(f"{self.directory}: checkpoint {step} holds no data-iterator state")
      items["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
    restored = self._mngr.restore(step, args=ocp.args.Composite(**items))
    log.info("restored checkpoint at step %d from %s", step, self.directory)
    state = _stack_layers(restored.state, _storable_target(target)) if unstacked else restored.state
    return _from_storable(state, target), dict(restored.meta)

  def wait_until_finished(self) -> None:
    self._mngr.wait_until_finished()

  def close(self) -> None:
    self._mngr.wait_until_finished()
    self._mngr.close()

  def __enter__(self) -> Checkpointer:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def model_config_of(checkpoint_dir: str | os.PathLike, *, step: int | None = None):
  """The `ModelConfig` a trainer stored in the metadata of checkpoint `step` (default the latest)."""
  from agentrl_jax.models.config import ModelConfig

  with Checkpointer(checkpoint_dir) as ckpt:
    step = ckpt._existing(step)  # pylint: disable=protected-access
    meta = ckpt.read_metadata(step)
  if "model_config" not in meta:
    raise ValueError(f"{checkpoint_dir}: checkpoint {step} stores no model_config")
  return ModelConfig(**meta["model_config"])


def load_model(checkpoint_dir: str | os.PathLike, model_config, mesh: jax.sharding.Mesh, *, step: int | None = None):
  """The `Qwen` model of `model_config` with the params of checkpoint `step` (default the latest), placed in
  their shardings on `mesh`; the optimizer state is not read.

  A LoRA run's checkpoint holds its adapters only, and its metadata the base they apply to (the run's `model`
  block and init key): the base is loaded as that run loaded it, and the adapters are restored onto it and
  folded into its weights (`lora.merged`: the same logits as the adapted model, up to float rounding).
  """
  from flax import nnx

  from agentrl_jax.models import hf_io
  from agentrl_jax.models import sharding as sharding_lib

  with Checkpointer(checkpoint_dir) as ckpt:
    step = ckpt._existing(step)  # pylint: disable=protected-access
    lora = ckpt.read_metadata(step).get("lora")
    if lora is not None:
      return _load_lora_model(ckpt, step, lora, mesh)
    graphdef, abstract = nnx.split(hf_io.abstract_model(model_config))
    target = abstract_state(abstract, sharding_lib.state_shardings(abstract, mesh))
    restored, _ = ckpt.restore({"train": {"params": target}}, step=step)
  return nnx.merge(graphdef, restored["train"]["params"])


def _load_lora_model(ckpt: "Checkpointer", step: int, lora: dict, mesh: jax.sharding.Mesh):
  """`load_model` of a LoRA checkpoint (its metadata's `lora` entry: `train_state.checkpoint_metadata`)."""
  import ml_collections
  from flax import nnx

  from agentrl_jax.models import lora as lora_lib
  from agentrl_jax.models import sharding as sharding_lib

  init_key = jax.random.wrap_key_data(jax.numpy.asarray(lora["init_key"], jax.numpy.uint32))
  _, model = load_policy(ml_collections.ConfigDict(lora["base_model"]), mesh, init_key)
  lora_lib.apply(model, lora_lib.LoraConfig(**lora["config"]), jax.random.key(0))  # placeholders, restored below
  graphdef, params = nnx.split(model)
  adapters, base = lora_lib.split(params)
  target = abstract_state(adapters, sharding_lib.state_shardings(adapters, mesh))
  restored, _ = ckpt.restore({"train": {"params": target}}, step=step)
  return lora_lib.merged(nnx.merge(graphdef, base, restored["train"]["params"]))


def tokenizer_and_config(m, overrides: dict | None = None):
  """`models.loading.tokenizer_and_config` of a `model` block, reading the `ModelConfig` a checkpoint of ours
  recorded when the block names one (`model.checkpoint`, `model.checkpoint_step`)."""
  from agentrl_jax.models import loading

  stored = model_config_of(m.checkpoint, step=m.get("checkpoint_step") or None) if m.get("checkpoint") else None
  return loading.tokenizer_and_config(m, overrides, stored=stored)


def load_policy(m, mesh: jax.sharding.Mesh, key: jax.Array):
  """(tokenizer, model) for a `model` config block (`models/loading.py` lists its fields), with params placed in
  their shardings on `mesh`: from a checkpoint of ours when the block names one (`load_model`: a LoRA run's
  adapters folded into the base it trained on), else an HF directory or a random init (`models.loading`)."""
  from agentrl_jax.models import loading

  if not m.get("checkpoint"):
    return loading.load_policy(m, mesh, key)
  tokenizer, cfg = tokenizer_and_config(m)
  model = load_model(m.checkpoint, cfg, mesh, step=m.get("checkpoint_step") or None)
  return loading.checked(tokenizer, model, f"checkpoint {m.checkpoint}")


def export_hf(checkpoint_dir: str | os.PathLike, out_dir: str | os.PathLike, *, step: int | None = None,
              model_config=None, tokenizer=None, dtype: str | None = None) -> str:
  """Writes the params of a checkpoint as a HF directory (`config.json` + safetensors) via `hf_io.export_hf`.

  Reads only the params (the trainers save `{"train": train_state.TrainState, ...}`), onto the first local device.

  Args:
    checkpoint_dir: a `Checkpointer` directory.
    out_dir: the HF directory to write.
    step: default the latest.
    model_config: the `ModelConfig`; default the `model_config` dict stored in the checkpoint's metadata.
    tokenizer: saved alongside when given.
    dtype: export dtype; default the model's param dtype.
  """
  from agentrl_jax.models import hf_io
  from agentrl_jax.models import sharding as sharding_lib

  model_config = model_config or model_config_of(checkpoint_dir, step=step)
  mesh = sharding_lib.make_mesh(1, 1, 1, devices=jax.local_devices()[:1])
  model = load_model(checkpoint_dir, model_config, mesh, step=step)
  return hf_io.export_hf(model, out_dir, dtype=dtype, tokenizer=tokenizer)


def main(argv=None) -> str:
  """`python -m agentrl_jax.checkpoint RUN/checkpoints OUT_DIR [--step N] [--dtype bfloat16] [--tokenizer DIR]`:
  a run's checkpoint as a HF directory (config.json, safetensors, tokenizer files with the chat template,
  generation_config.json) that `transformers` and vLLM-style servers load. The tokenizer defaults to the one the
  run trained with (recorded in the checkpoint's metadata)."""
  import argparse

  ap = argparse.ArgumentParser(description=main.__doc__.split(":", 1)[1].strip())
  ap.add_argument("checkpoint_dir")
  ap.add_argument("out_dir")
  ap.add_argument("--step", type=int, default=None, help="default: the latest")
  ap.add_argument("--dtype", default=None, help="export dtype (default: the param dtype), e.g. bfloat16")
  ap.add_argument("--tokenizer", default="", help="tokenizer directory (default: the run's)")
  args = ap.parse_args(argv)
  from agentrl_jax.models import tokenizer as tok_lib

  with Checkpointer(args.checkpoint_dir) as ckpt:
    step = ckpt._existing(args.step)  # pylint: disable=protected-access
    tok_path = args.tokenizer or ckpt.read_metadata(step).get("tokenizer_path", "")
  if not tok_path:
    raise SystemExit(f"{args.checkpoint_dir}: the checkpoint records no tokenizer; pass --tokenizer DIR")
  out = export_hf(args.checkpoint_dir, args.out_dir, step=step, tokenizer=tok_lib.load_tokenizer(tok_path),
                  dtype=args.dtype)
  print(f"exported step {step} of {args.checkpoint_dir} to {out}")
  return out


if __name__ == "__main__":
  main()
