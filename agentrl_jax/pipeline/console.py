"""What a pipeline run shows its user, and what it keeps in its log file.

The console gets progress bars, one line per stage (what it did, its wall and compile seconds) and the final
report. Everything logged (the project's INFO lines and every third-party log: Orbax, absl, TFDS, transformers,
backend probing, Python warnings) goes to `<workdir>/pipeline.log`; the project's own warnings also reach the
console.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import time

_FORMAT = "%(asctime)s %(levelname).1s %(name)s: %(message)s"
_EARLY: list[str] = []  # what third-party imports printed before the log file existed


def capture_import_noise() -> None:
  """Imports transformers with its import-time notices (e.g. "PyTorch was not found", which it prints on a
  machine without torch) captured instead of printed, and hands its logging to the root logger, so that those
  notices and every later transformers record go to the job's log file (`setup_logging`), not the console."""
  if "transformers" in sys.modules:
    return
  buffer = io.StringIO()
  with contextlib.redirect_stderr(buffer):
    try:
      from transformers.utils import logging as hf_logging
    except ImportError:
      return
    hf_logging.disable_default_handler()  # its stderr handler was bound to `buffer`
    hf_logging.enable_propagation()
  _EARLY.extend(line for line in buffer.getvalue().splitlines() if line.strip())


class _ProjectRecords(logging.Filter):
  def __init__(self, level: int):
    super().__init__()
    self.level = level

  def filter(self, record: logging.LogRecord) -> bool:
    return record.name.startswith("agentrl_jax") and record.levelno >= self.level


def setup_logging(log_path: str, console_level: int = logging.WARNING) -> logging.Handler:
  """Routes all logging to `log_path` and the project's records from `console_level` up to stderr (warnings for
  the pipeline, whose stages print their own lines; INFO for the standalone jobs of `main.py`); third-party
  records (Orbax, absl, TFDS, backend probing) go to the file only. Returns the file handler."""
  os.makedirs(os.path.dirname(log_path), exist_ok=True)
  try:  # absl (imported by JAX, Orbax, TFDS) installs its own stderr handler on the root logger
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.INFO)
    absl_logging.set_stderrthreshold(absl_logging.FATAL)
  except ImportError:
    pass
  root = logging.getLogger()
  for h in list(root.handlers):
    root.removeHandler(h)
  file_handler = logging.FileHandler(log_path)
  file_handler.setFormatter(logging.Formatter(_FORMAT))
  console = logging.StreamHandler(sys.stderr)
  console.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
  console.addFilter(_ProjectRecords(console_level))
  root.addHandler(file_handler)
  root.addHandler(console)
  root.setLevel(logging.INFO)
  logging.captureWarnings(True)
  for line in _EARLY:  # warnings when printed (transformers' own logger level keeps them at WARNING)
    logging.getLogger("transformers").warning("at import: %s", line)
  return file_handler


def say(message: str) -> None:
  """One line for the user (stdout), also kept in the log."""
  print(message, flush=True)
  logging.getLogger("agentrl_jax.pipeline").info(message)


def process_elapsed_s() -> float:
  """Seconds since this process started (interpreter start-up and imports included)."""
  try:
    with open("/proc/self/stat") as f:
      start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
      uptime = float(f.read().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
  except (OSError, ValueError, IndexError):
    return time.perf_counter()
