"""Code tool: executors for model-written Python (bubblewrap sandbox, SandboxFusion), the `code_interpreter`
tool's schema and formatting, and a test-case runner for code rewards.

    from agentrl_jax import tools
    executor = tools.make_executor(tools.ToolConfig(timeout_s=10))
    result = executor.submit(tools.prepare_code("2 ** 10")).result()
    tools.format_result(result, max_chars=4096)   # '1024'
"""

from agentrl_jax.tools.base import STATUSES, ExecResult, Executor, PoolExecutor, ToolConfig
from agentrl_jax.tools.code_interpreter import (TOOL_NAME, TOOL_SCHEMA, format_result, parse_arguments, prepare_code,
                                                truncate_middle)
from agentrl_jax.tools.executors import make_executor

__all__ = [
    "STATUSES", "ExecResult", "Executor", "PoolExecutor", "ToolConfig", "make_executor", "TOOL_NAME", "TOOL_SCHEMA",
    "format_result", "parse_arguments", "prepare_code", "truncate_middle",
]
