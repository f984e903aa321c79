"""Compiles a config's programs for a TPU slice and reports compile cost, memory and a roofline estimate.

See the package docstring for the command. The JSON object (`--json`):

    {"topology": "v5p:2x2x2", "chip": "TPU v5", "model": ..., "programs": [{"program": "rl/update",
     "shape": "B=256 T=23040 packed", "compile_cpu_s": ..., "code_mb": ..., "hbm_gib": ..., "hbm_limit_gib": ...,
     "fits": true, ...}], "total_compile_cpu_s": ..., "fits": true}

Compile cost is CPU seconds of this process (`time.process_time`), which a busy machine distorts far less than
wall time; a program whose module equals an earlier one's (`same_as`) was compiled again and keeps its cost.
Memory is the compiler's plan per device (`compiled.memory_analysis()`) plus what the run keeps in HBM beside
the program's own arguments while it runs (`Program.resident`): for scoring and rollouts the AdamW moments (and
the parameters when the sampler reads a copy), for every program after it is loaded a KL term's reference
parameters. The parameter and optimizer init programs are compiled and counted like the others.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
import sys
import time

import jax

from agentrl_jax import compile_stats
from agentrl_jax.aot import profile as profile_lib
from agentrl_jax.aot import programs as programs_lib
from agentrl_jax.aot import target as target_lib

log = logging.getLogger(__name__)
GIB = float(1 << 30)
# The compiler's out-of-memory verdicts: "Used 120.3G of 95.74G hbm", or "the total memory required for HLO
# temporaries (101.81G) exceeds available HBM (95.74G)".
_OOM = re.compile(r"Used ([\d.]+)([KMGT]) of [\d.]+[KMGT] hbm|\(([\d.]+)([KMGT])\) exceeds available HBM")
_UNITS = {"K": 2.0**10, "M": 2.0**20, "G": 2.0**30, "T": 2.0**40}


@dataclasses.dataclass
class CompiledProgram:
  """One program's report row (every byte count is per device)."""

  program: str
  shape: str
  compile_cpu_s: float
  lower_cpu_s: float
  code_mb: float
  argument_gib: float
  output_gib: float
  temp_gib: float
  alias_gib: float
  resident_gib: float
  hbm_gib: float
  hbm_limit_gib: float
  fits: bool
  xla_flops: float | None
  xla_bytes_accessed: float | None
  est_flops: float
  est_hbm_bytes: float
  est_step_s: float
  est_bound: str
  same_as: str = ""
  error: str = ""
  fit_hint: str = ""
  compile_phases: list = dataclasses.field(default_factory=list)  # with profile=True: [(phase, wall s)]

  def row(self) -> dict:
    return dataclasses.asdict(self)


def _fit_hint(p: programs_lib.Program, need: float, limit: float, scalable: float) -> str:
  """The largest value of the program's scale knob that fits (in whole multiples of its row shards), assuming
  `scalable` bytes grow with it."""
  if p.scale is None or scalable <= 0:
    return ""
  name, value = p.scale
  fixed = need - scalable
  if fixed >= limit:
    return f"does not fit even at {name}=0 ({fixed / GIB:.1f} GiB needed without them)"
  fit = int(value * (limit - fixed) / scalable) // p.step * p.step
  if fit < p.step:
    return (f"does not fit even at {p.step} {name}, one per row shard ({scalable / GIB * p.step / value:.1f} GiB "
            f"each of {limit / GIB:.1f} GiB a chip): shorter rows (the config's sequence length) or a larger "
            "slice")
  return f"largest {name} that fit: about {fit} (now {value}; {scalable / GIB:.1f} GiB of {need / GIB:.1f} scale with it)"


def compile_program(p: programs_lib.Program, t: target_lib.Target, resident: int = 0,
                    profile: bool = False) -> tuple[CompiledProgram, str]:
  """Lowers and compiles one program with the TPU compiler; returns its row and its module's fingerprint.
  `profile`: also the compiler's phases by time (`aot.profile`)."""
  c0 = time.process_time()
  lowered = p.lower()
  text = lowered.as_text()
  fingerprint = hashlib.sha256(text.encode()).hexdigest()
  c1 = time.process_time()
  limit = t.hbm_per_device
  flops_dev, bytes_dev = p.flops / p.devices, p.hbm_bytes / p.devices
  est = max(flops_dev / t.flops_per_device, bytes_dev / t.bytes_s_per_device)
  bound = "compute" if flops_dev / t.flops_per_device >= bytes_dev / t.bytes_s_per_device else "memory"
  base = dict(program=p.name, shape=p.shape, lower_cpu_s=round(c1 - c0, 2), hbm_limit_gib=round(limit / GIB, 2),
              resident_gib=round(resident / GIB, 3), est_flops=flops_dev, est_hbm_bytes=bytes_dev,
              est_step_s=est, est_bound=bound)
  phases = []
  try:
    with compile_stats.persistent_cache_off():
      if profile:
        compiled, phases = profile_lib.profile_compile(lowered)
      else:
        compiled = lowered.compile()
  except Exception as e:  # pylint: disable=broad-except  # the compiler's out-of-memory verdict is a result
    c2 = time.process_time()
    m = _OOM.search(str(e))
    if not m:
      raise
    need = (float(m.group(1)) * _UNITS[m.group(2)] if m.group(1) else float(m.group(3)) * _UNITS[m.group(4)]) + resident
    row = CompiledProgram(**base, compile_cpu_s=round(c2 - c1, 2), code_mb=0.0, argument_gib=0.0, output_gib=0.0,
                          temp_gib=0.0, alias_gib=0.0, hbm_gib=round(need / GIB, 3), fits=False, xla_flops=None,
                          xla_bytes_accessed=None, error=_oom_line(str(e)))
    row.fit_hint = _fit_hint(p, need, limit, need - resident - p.fixed_bytes if p.scale and p.scale[0] == "rollout rows"
                             else p.scale_bytes)
    return row, fingerprint
  c2 = time.process_time()
  mem = compiled.memory_analysis()
  cost = compiled.cost_analysis() or {}
  need = (mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes + mem.temp_size_in_bytes
          + mem.generated_code_size_in_bytes + resident)
  row = CompiledProgram(
      **base, compile_cpu_s=round(c2 - c1, 2), code_mb=round(mem.generated_code_size_in_bytes / 2**20, 1),
      argument_gib=round(mem.argument_size_in_bytes / GIB, 3), output_gib=round(mem.output_size_in_bytes / GIB, 3),
      temp_gib=round(mem.temp_size_in_bytes / GIB, 3), alias_gib=round(mem.alias_size_in_bytes / GIB, 3),
      hbm_gib=round(need / GIB, 3), fits=need <= limit, xla_flops=cost.get("flops"),
      xla_bytes_accessed=cost.get("bytes accessed"), compile_phases=phases)
  if not row.fits:
    row.fit_hint = _fit_hint(p, need, limit, _scalable(p, need, resident, mem.temp_size_in_bytes))
  return row, fingerprint


def _oom_line(message: str) -> str:
  """The compiler's out-of-memory verdict, in one line."""
  m = _OOM.search(message)
  return m.group(0) if m else message.strip().splitlines()[0][:300]


def _scalable(p: programs_lib.Program, need: float, resident: float, temp_bytes: float) -> float:
  """Bytes that grow with the program's scale knob: all of a rollout program's but the parameters it reads and
  what stays resident beside it (its cache, draws and temporaries are per row), or a training step's
  temporaries (its activations)."""
  if p.scale is None:
    return 0.0
  return need - resident - p.fixed_bytes if p.scale[0] == "rollout rows" else temp_bytes


def compile_all(config, topology: str, *, only: tuple[str, ...] = (), progress=None, profile: bool = False) -> dict:
  """Compiles every program of `config` for `topology`; returns the report (the JSON object above).

  Args:
    only: compile only programs whose name contains one of these strings (e.g. ("update", "decode")).
    progress: called with each finished row (the CLI prints it).
    profile: record each program's compiler phases by time (`compile_phases`).
  """
  t = target_lib.target(topology)
  # Every program is compiled for real: the persistent cache would hide the cost measured (and cannot load a
  # program for devices this process does not have).
  with compile_stats.persistent_cache_off():
    return _compile_all(config, t, topology, only, progress, profile)


def _compile_all(config, t: target_lib.Target, topology: str, only, progress, profile: bool) -> dict:
  plan = programs_lib.for_config(config, t)
  rows, seen = [], {}
  for p in plan.programs:
    if only and not any(o in p.name for o in only):
      continue
    row, fingerprint = compile_program(p, t, p.resident, profile)
    if fingerprint in seen:
      # The same module as an earlier program; it was compiled again here (as a run's separate jitted function
      # is), so its compile cost is real and counted.
      row.same_as = seen[fingerprint]
    else:
      seen[fingerprint] = f"{p.name} {p.shape}"
    rows.append(row)
    if progress:
      progress(row)
  cfg = plan.model_cfg
  return {"topology": topology, "chip": t.device_kind, "devices": len(t.devices),
          "hbm_per_device_gib": round(t.hbm_per_device / GIB, 2), "job": config.job,
          "model": {"source": plan.model_source, "family": cfg.family, "params": cfg.param_count(),
                    "layers": cfg.num_layers, "scan_layers": cfg.scan_layers, "remat": cfg.remat,
                    "param_dtype": cfg.param_dtype, "dtype": cfg.dtype, "attention_impl": cfg.attention_impl},
          "notes": plan.notes, "programs": [r.row() for r in rows],
          "total_compile_cpu_s": round(sum(r.compile_cpu_s for r in rows), 2),
          "fits": all(r.fits for r in rows)}


# ------------------------------------------------------------------------------------------------------------
# Output
# ------------------------------------------------------------------------------------------------------------

_COLUMNS = (("program", "program", 16, "s"), ("shape", "shape", 30, "s"), ("compile_cpu_s", "compile s", 9, ".1f"),
            ("code_mb", "code MB", 7, ".1f"), ("argument_gib", "args GiB", 8, ".2f"), ("temp_gib", "temp GiB", 8, ".2f"),
            ("hbm_gib", "HBM GiB", 8, ".2f"), ("hbm_limit_gib", "of GiB", 6, ".1f"), ("fits", "fits", 4, "s"),
            ("est_step_s", "est. s", 8, ".4f"), ("est_bound", "bound", 7, "s"))


def format_table(report: dict) -> str:
  lines = [f"{report['job']} on {report['topology']} ({report['devices']} x {report['chip']}, "
           f"{report['hbm_per_device_gib']} GiB HBM each): {report['model']['source']}, "
           f"{report['model']['params'] / 1e9:.2f}B params, {report['model']['layers']} layers "
           f"({'scanned' if report['model']['scan_layers'] else 'unrolled'}), {report['model']['dtype']} compute, "
           f"attention {report['model']['attention_impl']}"]
  head = " | ".join(f"{title:>{w}}" if fmt != "s" else f"{title:<{w}}" for _, title, w, fmt in _COLUMNS)
  lines += [head, "-" * len(head)]
  for r in report["programs"]:
    cells = []
    for key, _, w, fmt in _COLUMNS:
      v = r[key]
      v = ("yes" if v else "NO") if key == "fits" else v
      cells.append(f"{v:<{w}}" if fmt == "s" else f"{v:>{w}{fmt}}")
    lines.append(" | ".join(cells) + (f"  (= {r['same_as']})" if r["same_as"] else ""))
    if r["fit_hint"]:
      lines.append(f"    ^ needs {r['hbm_gib']:.2f} GiB of {r['hbm_limit_gib']:.1f}: {r['fit_hint']}")
    if r["compile_phases"]:
      lines.append("    compiler phases (wall s, nested): " + ", ".join(f"{k} {v:.1f}" for k, v in r["compile_phases"]))
  lines.append(f"total compile: {report['total_compile_cpu_s']:.1f} CPU s for {len(report['programs'])} programs "
               f"({sum(1 for r in report['programs'] if not r['same_as'])} distinct modules, each compiled). "
               "est. s: roofline estimate of "
               "one call from data-sheet peak FLOP/s and HBM bandwidth (a decode row: one segment of steps).")
  lines += [f"note: {n}" for n in report["notes"]]
  return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------------------

def main(config, topology: str, *, as_json: bool = False, only=(), profile: bool = False) -> int:
  """Runs the pre-flight; prints the table (or JSON); returns the exit code (1 when a program does not fit)."""
  show = (lambda r: print(f"  compiled {r.program} {r.shape}: {r.compile_cpu_s:.1f} CPU s, {r.hbm_gib:.2f} GiB",
                          file=sys.stderr, flush=True))
  report = compile_all(config, topology, only=tuple(only), progress=show, profile=profile)
  print(json.dumps(report) if as_json else format_table(report))
  bad = [r for r in report["programs"] if not r["fits"]]
  for r in bad:
    print(f"aot: {r['program']} ({r['shape']}) does not fit: needs {r['hbm_gib']:.2f} GiB per device of "
          f"{r['hbm_limit_gib']:.1f} GiB ({r['hbm_gib'] * GIB:,.0f} bytes). {r['fit_hint']}", file=sys.stderr)
  return 1 if bad else 0
