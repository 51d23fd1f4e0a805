"""Launching on Beaker: what `mason.py` builds, as pure functions (standard library and PyYAML only, so the
launcher runs outside the training environment).

- `settings`: mason's options (`MasonArgs`, each declared once with config.fields.arg), the account, Ai2's clusters.
- `commands`: a command's argv as one `bash -c` string, and the flags mason adds to a grpo_fast.py command.
- `beaker_spec`: the Beaker v2 experiment spec: tasks, environment, secrets, mounts.
"""
