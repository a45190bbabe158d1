"""Environments for agentic RL: tool calls in the model's own format, tools as plain Python callables with a
JSON-schema signature (a calculator, a table lookup), and the environment protocol a rollout drives."""
