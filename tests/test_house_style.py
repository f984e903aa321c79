"""The house style a reviewer would otherwise check by eye: one indentation style across the code (2 spaces a
level, as DESIGN.md's peers use; no tabs)."""

import io
import os
import tokenize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIRS = ("agentrl_jax", "configs", "tests", "launch", "colab")


def _python_files():
  for top in DIRS:
    for path, dirs, files in os.walk(os.path.join(ROOT, top)):
      dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
      yield from (os.path.join(path, f) for f in files if f.endswith(".py"))


def _indent_errors(source: str) -> list[str]:
  """Each indented block that is not 2 spaces deeper than the one around it, or indents with a tab."""
  errors, depth = [], [0]
  for tok in tokenize.generate_tokens(io.StringIO(source).readline):
    if tok.type == tokenize.INDENT:
      width = len(tok.string.expandtabs(8))
      tab = "\t" in tok.string
      if tab or width - depth[-1] != 2:
        errors.append(f"line {tok.start[0]}: indented by {width - depth[-1]}" + " with a tab" * tab)
      depth.append(width)
    elif tok.type == tokenize.DEDENT:
      depth.pop()
  return errors


def test_the_check_sees_four_spaces_and_tabs():
  assert _indent_errors("def f(x):\n  if x:\n    return 1\n  return 2\n") == []
  assert _indent_errors("def f():\n    return 1\n") == ["line 2: indented by 4"]
  assert _indent_errors("def f():\n\treturn 1\n") == ["line 2: indented by 8 with a tab"]
  # continuation lines are free (aligned arguments), only blocks count
  assert _indent_errors("x = f(1,\n      2)\nif x:\n  y = [\n      3]\n") == []


def test_every_python_file_indents_two_spaces_a_level():
  files = sorted(_python_files())
  assert len(files) > 200, files[:5]  # the walk found the code
  bad = {os.path.relpath(f, ROOT): errs for f in files if (errs := _indent_errors(open(f, encoding="utf-8").read()))}
  assert not bad, bad
