"""Embedded task families for CPU runs, tests and the demo: arithmetic (with a scripted teacher) and the digits
sanity task. Importing the package registers the tasks' reward kinds with `agentrl_jax.rewards`."""

from agentrl_jax.tasks import digits  # noqa: F401  (registers the "digit_fraction" reward kind)
