"""The interactive PrecisionTool shell (`precision-tool shell`).

Pure layer (no prompt_toolkit, nothing prints): `session` (dumps by role,
cached comparison), `commands` (the table, generated from command specs: the shared ones of
`precision_tool.commands.registry` and the shell's own),
`parsing` (`;`, shlex, click parsing), `runner` (a line -> outcomes),
`completion` (suggestions), `tensors` (the TENSOR grammar), and the handlers
in `ops`, `tensor_commands`, `elementwise` and `checks`, which return the
dataclasses of `results` or of the analysis and comparator.

UI adapter: `completer` (prompt_toolkit Completer), `app` (PromptSession
factory, history, key bindings, toolbar, style, the loop) and `output`
(renders outcomes with `precision_tool.render.shell_views`).
"""
