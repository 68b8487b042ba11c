"""The command layer both front ends build on: one spec per command, its handler, and what it returns.

`spec` (CommandSpec, Registry), `registry` (the specs of the commands that read dumps), `handlers` (one per
batch/shell pair), `sources` (the batch commands' dumps, `DumpFiles`), `options` (click parameter types and
options shared by both front ends) and `results` (the result dataclasses). Below `precision_tool.render`
(which draws these types, chosen by type) and above the core (compare, analysis, dump), so that `cli/` and
`repl/` are both generated from it and neither needs the other. It imports click, never rich or prompt_toolkit.
"""
