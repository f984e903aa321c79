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
from agentrl_jax.tools import base, executors, sandbox, sandbox_fusion
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
  server.stall_next, server.stall_s = 1, 4.0  # the retry has 2 s: a sandbox run on a loaded host fits
  r = sandbox_fusion.run_code("print(1)", "", fusion_cfg(server.url, retries=2, request_timeout_s=2.0))
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


# ---------------------------------------------------------------------------------------------------------------
# Recorded bodies: the client against responses in SandboxFusion's documented JSON schema, replayed verbatim (no
# sandbox behind them, so these run on any machine). The schema: RunCodeRequest / RunCodeResponse in
# sandbox/server/sandbox_api.py:40-66, CommandRunResult in sandbox/runners/types.py:21-32 of bytedance/SandboxFusion;
# `status` is Failed for a non-zero exit or a time limit and SandboxError for a runner Error (parse_run_status).
# ---------------------------------------------------------------------------------------------------------------

_RUN_CODE_REQUEST_FIELDS = {"compile_timeout", "run_timeout", "memory_limit_MB", "code", "stdin", "language", "files",
                            "fetch_files"}


def _response(status, run_result, message="", compile_result=None):
  return json.dumps({"status": status, "message": message, "compile_result": compile_result,
                     "run_result": run_result, "executor_pod_name": None, "files": {}})


RECORDED = {
    # The docs' own sample output (docs/docs/docs/get-started.mdx), byte for byte.
    'print("Hello, world!")': '{\n  "status": "Success",\n  "message": "",\n  "compile_result": null,\n'
                              '  "run_result": {\n    "status": "Finished",\n    "execution_time": 0.016735315322875977,'
                              '\n    "return_code": 0,\n    "stdout": "Hello, world!\\n",\n    "stderr": ""\n  },\n'
                              '  "executor_pod_name": null,\n  "files": {}\n}',
    "1/0": _response("Failed", {"status": "Finished", "execution_time": 0.021, "return_code": 1, "stdout": "",
                                "stderr": "Traceback (most recent call last):\n  File \"/tmp/tmpq1/tmp.py\", line 1, "
                                          "in <module>\n    1/0\nZeroDivisionError: division by zero\n"}),
    "import time\nprint('tick')\ntime.sleep(99)": _response(
        "Failed", {"status": "TimeLimitExceeded", "execution_time": 30.002, "return_code": None, "stdout": "tick\n",
                   "stderr": ""}),
    "x = bytearray(8 * 1024 ** 3)": _response(
        "Failed", {"status": "Finished", "execution_time": 0.05, "return_code": 1, "stdout": "",
                   "stderr": "Traceback (most recent call last):\n  File \"/tmp/tmpq2/tmp.py\", line 1, in <module>\n"
                             "MemoryError\n"}),
    "import os\nos.kill(os.getpid(), 9)": _response(
        "Failed", {"status": "Finished", "execution_time": 0.03, "return_code": -9, "stdout": None, "stderr": None}),
    "print(input()[::-1])": _response("Success", {"status": "Finished", "execution_time": 0.02, "return_code": 0,
                                                  "stdout": "cba\n", "stderr": None}),
    "import sys": _response(
        "SandboxError", {"status": "Error", "execution_time": None, "return_code": None, "stdout": None,
                         "stderr": "exception on running command python /tmp/tmpq3/tmp.py: [Errno 24] Too many open "
                                   "files | None"},
        message="exception on running command python /tmp/tmpq3/tmp.py: [Errno 24] Too many open files | None"),
    "pass": _response("SandboxError", None, message="exception on running code pass: runner crashed None"),
}


class RecordedServer(http.server.ThreadingHTTPServer):
  """Answers `/run_code` with the recorded body for the request's code; keeps every request body as sent."""

  daemon_threads = True

  def __init__(self):
    super().__init__(("127.0.0.1", 0), _RecordedHandler)
    self.requests: list[tuple[dict, str]] = []  # (body, Content-Type)
    self.lock = threading.Lock()

  @property
  def url(self) -> str:
    return f"http://127.0.0.1:{self.server_address[1]}/run_code"


class _RecordedHandler(http.server.BaseHTTPRequestHandler):
  server: RecordedServer

  def log_message(self, *args):
    pass

  def do_POST(self):  # pylint: disable=invalid-name
    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
    with self.server.lock:
      self.server.requests.append((body, self.headers.get("Content-Type", "")))
    data = RECORDED.get(body.get("code"))
    status = 200 if data is not None else 422
    data = (data if data is not None else '{"detail": [{"msg": "unrecorded request"}]}').encode()
    self.send_response(status)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)


@pytest.fixture
def recorded():
  srv = RecordedServer()
  thread = threading.Thread(target=srv.serve_forever, daemon=True)
  thread.start()
  yield srv
  srv.shutdown()
  srv.server_close()


def test_recorded_responses_map_to_results(recorded):
  """The recipe's tool limits (30 s, 2048 MB) go out in a RunCodeRequest; each documented response maps to the
  status the local sandbox would report."""
  cfg = fusion_cfg(recorded.url, timeout_s=30.0, memory_mb=2048, retries=0)
  programs = list(RECORDED)
  stdins = ["abc" if p == "print(input()[::-1])" else "" for p in programs]
  with executors.make_executor(cfg) as executor:
    results = dict(zip(programs, executor.run_batch(programs, stdins)))
  hello = results['print("Hello, world!")']
  assert (hello.status, hello.stdout, hello.stderr, hello.exit_code) == ("ok", "Hello, world!\n", "", 0)
  div = results["1/0"]
  assert (div.status, div.exit_code) == ("error", 1) and div.stderr.endswith("ZeroDivisionError: division by zero\n")
  tle = results["import time\nprint('tick')\ntime.sleep(99)"]
  assert tle.status == "timeout" and tle.stdout == "tick\n" and "time limit of 30 s exceeded" in tle.stderr
  assert results["x = bytearray(8 * 1024 ** 3)"].status == "memory"
  killed = results["import os\nos.kill(os.getpid(), 9)"]
  assert (killed.status, killed.exit_code, killed.stdout) == ("killed", -9, "") and "SIGKILL" in killed.stderr
  assert results["print(input()[::-1])"].stdout == "cba\n" and results["print(input()[::-1])"].stderr == ""
  runner_error = results["import sys"]
  assert runner_error.status == "sandbox_error" and "Too many open files" in runner_error.stderr
  assert results["pass"].status == "sandbox_error" and "runner crashed" in results["pass"].stderr

  # One request each (SandboxFusion's retries are for 5xx and timeouts), except the two server failures: the
  # executor runs each once more, then a probe program, which this server does not answer either: the
  # infrastructure is broken, so they stay sandbox_error.
  probes = [body for body, _ in recorded.requests if body["code"] == base.PROBE_CODE]
  assert len(recorded.requests) - len(probes) == len(programs) + 2 and 1 <= len(probes) <= 2
  for body, content_type in recorded.requests:
    assert content_type == "application/json"
    assert set(body) <= _RUN_CODE_REQUEST_FIELDS and {"code", "language"} <= set(body)
    assert body["language"] == "python" and isinstance(body["code"], str)
    assert body["run_timeout"] == 30.0 and body["compile_timeout"] == 30.0
    assert body["memory_limit_MB"] == 2048 and isinstance(body["memory_limit_MB"], int)
    assert isinstance(body["stdin"], str) and body["files"] == {} and body["fetch_files"] == []
  by_code = {body["code"]: body for body, _ in recorded.requests}
  assert by_code["print(input()[::-1])"]["stdin"] == "abc"


def test_a_request_outside_the_schema_is_not_retried(recorded):
  """FastAPI answers a body it cannot validate with 422: a client error, reported at once."""
  r = sandbox_fusion.run_code("never recorded", "", fusion_cfg(recorded.url, retries=3))
  assert r.status == "sandbox_error" and "422" in r.stderr and "unrecorded request" in r.stderr
  assert len(recorded.requests) == 1
