"""SandboxFusion backend against a local HTTP server implementing `/run_code` on top of our own sandbox.

The server follows SandboxFusion's contract (sandbox/server/sandbox_api.py): RunCodeRequest in, RunCodeResponse
out, `run_result.status` Finished / TimeLimitExceeded / Error, top-level status Success / Failed / SandboxError.
It can be told to fail the first requests with HTTP 503 or to stall, to exercise the client's retries.
"""

from __future__ import annotations

import http.server
import json
import threading
import time

import pytest

from agentrl_jax import rewards
from agentrl_jax.tools import executors, sandbox, sandbox_fusion
from agentrl_jax.tools.base import ToolConfig
from tests.tools.sandbox_testing import needs_bwrap


class FusionServer(http.server.ThreadingHTTPServer):
  """A SandboxFusion look-alike; `fail_next` 503s and `stall_next` slow requests are consumed in order."""

  daemon_threads = True

  def __init__(self):
    super().__init__(("127.0.0.1", 0), _Handler)
    self.requests: list[dict] = []
    self.fail_next = 0
    self.stall_next = 0
    self.stall_s = 0.0
    self.lock = threading.Lock()

  @property
  def url(self) -> str:
    return f"http://127.0.0.1:{self.server_address[1]}/run_code"


class _Handler(http.server.BaseHTTPRequestHandler):
  server: FusionServer

  def log_message(self, *args):  # keep pytest output clean
    pass

  def do_POST(self):  # pylint: disable=invalid-name
    if self.path != "/run_code":
      self._reply(404, {"detail": "Not Found"})
      return
    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
    with self.server.lock:
      self.server.requests.append(body)
      fail, stall = self.server.fail_next > 0, self.server.stall_next > 0
      self.server.fail_next -= fail
      self.server.stall_next -= stall
    if fail:
      self._reply(503, {"detail": "overloaded"})
      return
    if stall:
      time.sleep(self.server.stall_s)
    if body.get("language") != "python" or not isinstance(body.get("code"), str):
      self._reply(422, {"detail": "validation error"})
      return
    memory = body.get("memory_limit_MB", -1)
    r = sandbox.run_python(body["code"], timeout_s=float(body.get("run_timeout", 10)),
                           memory_mb=memory if memory > 0 else 1024, stdin=body.get("stdin") or "")
    run = {"status": "Finished", "execution_time": r.wall_s, "return_code": r.exit_code, "stdout": r.stdout,
           "stderr": r.stderr}
    if r.status == "timeout":
      run.update(status="TimeLimitExceeded", return_code=None)
    if r.status == "sandbox_error":
      self._reply(200, {"status": "SandboxError", "message": r.stderr, "run_result": {**run, "status": "Error"}})
      return
    self._reply(200, {"status": "Success" if r.status == "ok" else "Failed", "message": "", "compile_result": None,
                      "run_result": run, "executor_pod_name": None, "files": {}})

  def _reply(self, code: int, payload: dict):
    data = json.dumps(payload).encode()
    self.send_response(code)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)


@pytest.fixture
def server():
  srv = FusionServer()
  thread = threading.Thread(target=srv.serve_forever, daemon=True)
  thread.start()
  yield srv
  srv.shutdown()
  srv.server_close()


def fusion_cfg(url: str, **kw) -> ToolConfig:
  return ToolConfig(**{"backend": "sandbox_fusion", "sandbox_fusion_url": url, "timeout_s": 2.0, "memory_mb": 256,
                       "max_concurrency": 4, "retry_backoff_s": 0.01, **kw})


@needs_bwrap
def test_same_results_as_the_local_backend(server):
  programs = [("print(input()[::-1])", "abc"), ("raise ValueError('bad')", ""), ("while True:\n  pass", ""),
              ("x = bytearray(4 * 1024 ** 3)", ""), ("import ctypes\nctypes.string_at(0)", "")]
  with executors.make_executor(fusion_cfg(server.url)) as executor:
    assert isinstance(executor, sandbox_fusion.SandboxFusionExecutor)
    results = executor.run_batch([p for p, _ in programs], [s for _, s in programs])
  assert [r.status for r in results] == ["ok", "error", "timeout", "memory", "killed"]
  assert results[0].stdout == "cba\n" and "ValueError: bad" in results[1].stderr
  assert results[4].exit_code == -11
  sent = next(r for r in server.requests if r["code"] == programs[0][0])
  assert sent["language"] == "python" and sent["run_timeout"] == 2.0 and sent["memory_limit_MB"] == 256
  assert sent["stdin"] == "abc" and sent["files"] == {} and sent["fetch_files"] == []


@needs_bwrap
def test_retries_5xx_then_succeeds(server):
  server.fail_next = 2
  r = sandbox_fusion.run_code("print('after retries')", "", fusion_cfg(server.url, retries=3))
  assert r.status == "ok" and r.stdout == "after retries\n"
  assert len(server.requests) == 3


@needs_bwrap
def test_retries_request_timeouts(server):
  server.stall_next, server.stall_s = 1, 1.5
  r = sandbox_fusion.run_code("print(1)", "", fusion_cfg(server.url, retries=2, request_timeout_s=0.5))
  assert r.status == "ok" and len(server.requests) == 2


def test_gives_up_with_sandbox_error(server):
  server.fail_next = 10
  r = sandbox_fusion.run_code("print(1)", "", fusion_cfg(server.url, retries=2))
  assert r.status == "sandbox_error" and "after 3 attempts" in r.stderr and "503" in r.stderr
  bad = fusion_cfg(server.url.replace("/run_code", "/nope"), retries=3)
  r = sandbox_fusion.run_code("print(1)", "", bad)
  assert r.status == "sandbox_error" and "404" in r.stderr and len(server.requests) == 3  # 4xx: no retry
  srv_port = server.server_address[1]
  server.shutdown()
  server.server_close()
  r = sandbox_fusion.run_code("print(1)", "", fusion_cfg(f"http://127.0.0.1:{srv_port}/run_code", retries=1))
  assert r.status == "sandbox_error" and "failed after 2 attempts" in r.stderr


def test_maps_malformed_and_error_responses():
  cfg = fusion_cfg("http://unused")
  assert sandbox_fusion.result_from_response("nope", cfg).status == "sandbox_error"
  assert sandbox_fusion.result_from_response({"status": "Success"}, cfg).status == "sandbox_error"
  r = sandbox_fusion.result_from_response({"status": "SandboxError", "message": "pod died"}, cfg)
  assert r.status == "sandbox_error" and "pod died" in r.stderr
  r = sandbox_fusion.result_from_response(
      {"status": "Failed", "run_result": {"status": "Finished", "return_code": 1, "stdout": None, "stderr": "E"}}, cfg)
  assert (r.status, r.stdout, r.stderr, r.exit_code) == ("error", "", "E", 1)
  huge = sandbox_fusion.result_from_response(
      {"status": "Success", "run_result": {"status": "Finished", "return_code": 0, "stdout": "x" * 10 ** 6}}, cfg)
  assert huge.status == "ok" and len(huge.stdout) < cfg.max_output_bytes + 100


@needs_bwrap
def test_code_reward_through_sandbox_fusion(server):
  tests = {"inputs": ["3\n", "10\n"], "outputs": ["6\n", "20\n"]}
  with executors.make_executor(fusion_cfg(server.url)) as executor:
    good = rewards.compute_score("livecodebench", "```python\nprint(int(input()) * 2)\n```", tests, executor=executor)
    half = rewards.compute_score("livecodebench", "```python\nn = int(input())\nprint(6 if n == 3 else 0)\n```",
                                 tests, executor=executor)
  assert (good.score, good.acc) == (1.0, True)
  assert (half.score, half.acc) == (0.5, False)
