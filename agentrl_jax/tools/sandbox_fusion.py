"""Executor backed by a SandboxFusion server (https://github.com/bytedance/SandboxFusion), the recipe's
code-execution service at scale. Plain HTTP (stdlib) against its `/run_code` endpoint.

Contract (sandbox/server/sandbox_api.py of SandboxFusion):
  request   {code, language: 'python', run_timeout, compile_timeout, memory_limit_MB, stdin, files, fetch_files}
  response  {status: 'Success' | 'Failed' | 'SandboxError', message,
             run_result: {status: 'Finished' | 'TimeLimitExceeded' | 'Error', return_code, stdout, stderr,
                          execution_time}, compile_result, files}

    executor = executors.make_executor(ToolConfig(backend="sandbox_fusion",
                                                  sandbox_fusion_url="http://localhost:8080/run_code"))
"""

from __future__ import annotations

import dataclasses

import http.client
import json
import logging
import time
import urllib.error
import urllib.request
from typing import Any

from agentrl_jax.tools.base import ExecResult, PoolExecutor, ToolConfig, classify_exit, with_note

logger = logging.getLogger(__name__)
_SLACK_S = 30.0  # default request timeout beyond the run timeout: queueing and start-up on the server


def _cap(text: Any, max_bytes: int) -> str:
  """Keeps head and tail of a (possibly huge) server string within about `max_bytes` characters."""
  if not isinstance(text, str):
    text = "" if text is None else str(text)
  if len(text) <= max_bytes:
    return text
  half = max_bytes // 2
  return f"{text[:half]}\n[... {len(text) - 2 * half} characters omitted ...]\n{text[-half:]}"


def result_from_response(resp: Any, cfg: ToolConfig, wall_s: float = 0.0) -> ExecResult:
  """Maps a `/run_code` JSON response to an `ExecResult`."""
  if not isinstance(resp, dict):
    return ExecResult("sandbox_error", stderr=f"[sandbox] SandboxFusion returned a non-object: {str(resp)[:200]}",
                      wall_s=wall_s)
  run = resp.get("run_result") if isinstance(resp.get("run_result"), dict) else {}
  compile_ = resp.get("compile_result") if isinstance(resp.get("compile_result"), dict) else {}
  stdout = _cap(run.get("stdout"), cfg.max_output_bytes)
  stderr = _cap(run.get("stderr"), cfg.max_output_bytes)
  if resp.get("status") == "SandboxError" or run.get("status") == "Error" or compile_.get("status") == "Error":
    msg = str(resp.get("message") or "").strip()[:1000]
    return ExecResult("sandbox_error", stdout, with_note(stderr, f"SandboxFusion error: {msg or 'no message'}"),
                      None, wall_s)
  if run.get("status") == "TimeLimitExceeded" or compile_.get("status") == "TimeLimitExceeded":
    return ExecResult("timeout", stdout, with_note(stderr, f"time limit of {cfg.timeout_s:g} s exceeded; "
                                                   "process killed"), None, wall_s)
  if not run:
    return ExecResult("sandbox_error", stdout, with_note(stderr, f"SandboxFusion response without run_result "
                                                         f"(status {resp.get('status')!r})"), None, wall_s)
  code = run.get("return_code")
  if not isinstance(code, int) or isinstance(code, bool):
    code = None
  status, code, stderr = classify_exit(code, stderr)
  return ExecResult(status, stdout, stderr, code, wall_s)


def run_code(code: str, stdin: str, cfg: ToolConfig) -> ExecResult:
  """Runs one program on the server, retrying HTTP 5xx, connection errors and timeouts."""
  payload = json.dumps({
      "code": code,
      "language": "python",
      "run_timeout": cfg.timeout_s,
      "compile_timeout": cfg.timeout_s,
      "memory_limit_MB": cfg.memory_mb,
      "stdin": stdin,
      "files": {},
      "fetch_files": [],
  }).encode("utf-8", errors="surrogateescape")
  timeout = cfg.request_timeout_s if cfg.request_timeout_s is not None else cfg.timeout_s + _SLACK_S
  start = time.monotonic()
  last = ""
  for attempt in range(cfg.retries + 1):
    if attempt:
      time.sleep(cfg.retry_backoff_s * 2 ** (attempt - 1))
    request = urllib.request.Request(cfg.sandbox_fusion_url, data=payload, method="POST",
                                     headers={"Content-Type": "application/json", "Accept": "application/json"})
    try:
      with urllib.request.urlopen(request, timeout=timeout) as response:
        body = response.read()
    except urllib.error.HTTPError as e:
      last = f"HTTP {e.code} {e.reason}"
      if 500 <= e.code < 600:
        logger.warning("SandboxFusion %s (attempt %d/%d)", last, attempt + 1, cfg.retries + 1)
        continue
      detail = e.read()[:500].decode("utf-8", errors="replace")
      return ExecResult("sandbox_error", stderr=f"[sandbox] SandboxFusion rejected the request: {last}: {detail}",
                        wall_s=time.monotonic() - start)
    except (http.client.HTTPException, OSError) as e:  # URLError, refused, reset, timeouts
      last = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
      logger.warning("SandboxFusion request failed: %s (attempt %d/%d)", last, attempt + 1, cfg.retries + 1)
      continue
    try:
      resp = json.loads(body)
    except ValueError:
      return ExecResult("sandbox_error", stderr=f"[sandbox] SandboxFusion returned invalid JSON: {body[:200]!r}",
                        wall_s=time.monotonic() - start)
    return result_from_response(resp, cfg, time.monotonic() - start)
  return ExecResult("sandbox_error", stderr=f"[sandbox] SandboxFusion at {cfg.sandbox_fusion_url} failed after "
                    f"{cfg.retries + 1} attempts; last error: {last}", wall_s=time.monotonic() - start)


class SandboxFusionExecutor(PoolExecutor):
  """`Executor` sending each program to a SandboxFusion server, `cfg.concurrency` requests at a time."""

  def __init__(self, cfg: ToolConfig):
    if cfg.backend != "sandbox_fusion":
      raise ValueError(f"SandboxFusionExecutor needs ToolConfig.backend='sandbox_fusion', got {cfg.backend!r}")
    self.cfg = cfg
    def run_one(code: str, stdin: str, output_limit_bytes: int | None = None) -> ExecResult:
      limited = cfg if output_limit_bytes is None else dataclasses.replace(
          cfg, max_output_bytes=output_limit_bytes, output_limit_bytes=output_limit_bytes)
      return run_code(code, stdin, limited)

    super().__init__(run_one, cfg.concurrency, "sandbox_fusion")
