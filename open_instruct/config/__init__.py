"""The run's configuration: parsed once from open-instruct-compatible flags, frozen afterwards. The ground floor:
it imports nothing of ours beyond errors.

core.py        `Config` (one field per group), `parse_config`, the rules that span groups, derived values
run.py         the run: naming, tracking, length, evaluation schedule, checkpoints and resume
model.py       the policy and its tokenizer: source, loading, dtype, attention
data.py        the prompt datasets: mixes, columns, templating, filters, cache
generation.py  the engines: batch shape, sampling, lookahead, weight syncs, faults
staleness.py   how old a trained token may be: K (--max_off_policy_steps), the off-policy action, and the
               `StalenessPolicy` parsed from them once
algorithm.py   the objective: advantages, loss, off-policy correction, reference policy
rewards.py     verifiers, shaping, judges, rubrics
tools.py       tools and environments of multi-turn rollouts
learner.py     optimizer, micro-batches, DeepSpeed, placement, weight transport
compat.py      open-instruct's flags that do nothing here (Beaker only, no effect, not supported yet), and the
               few defaults unlike its own, with their reasons
fields.py      how a flag is declared (kind, help) and read back
derived.py     values the runtime derives from several flags (dtype, resumable-state schedule)
"""
