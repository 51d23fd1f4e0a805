"""The run's configuration: parsed once from open-instruct-compatible flags, frozen afterwards.

core.py       `Config` (the flag groups), `parse_config`, the rules that span groups
derived.py    values derived from several flags, read by the runtime (dtype, resumable-state schedule)
fields.py     how a flag is declared (kind, help) and read back
parity.py     open-instruct parity: accepted-but-inert flags, aliases, value translations
resources.py  GPU and node arithmetic: placement shares, learner/engine counts, scheduler names
"""
