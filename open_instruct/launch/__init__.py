"""Launching on Beaker: what `mason.py` builds, as pure functions (standard library and PyYAML only, so the
launcher runs outside the training environment).

- `commands`: a command's argv as one `bash -c` string; the flags mason adds to a grpo_fast.py command
  (resumable state, outputs on Weka, entities, the dataset cache key). mason.py runs the caching itself.
- `beaker_spec`: the Beaker v2 experiment spec: tasks, environment, secrets, mounts.
- `settings`: the launch's options (`MasonArgs`: each declared once, with config.fields.arg, parsed once,
  and the warnings about them), the account, Ai2's clusters.
"""
