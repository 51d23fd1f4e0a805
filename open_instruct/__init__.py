"""open_instruct: async-streaming GRPO with verifiable rewards.

The package's map. Its top-level modules (the loop, its pure logic, the entry points):

grpo_fast.py       CLI entry: parse flags, load data, build the Ray-backed collaborators, run the loop
preflight.py       --preflight: tokenizer, template, datasets, tools, endpoints, GPU arithmetic, without Ray
stack_check.py     the environment's torch/vLLM builds against the GPUs and driver: one line, at start-up
orchestrator.py    `TrainingLoop`: admit -> stream -> buffer -> train -> sync -> eval/checkpoint/log
cluster.py         Ray init, placement groups (the only `ray.remote`), `Stack`: a run's Ray-backed collaborators
fate_share.py      the local Ray cluster ends with its driver, shut down or SIGKILLed (a watcher process)
placement.py       where engines and learners go and which transport joins them (pure)
messages.py        every message that crosses a process: PromptRequest, Completion, TrainBatch, replies
errors.py          `UserError`: what a user can fix, printed as one line without a traceback
extensions.py      the registries of verifiers, tools and environments (register_*: built-ins and yours alike),
                   and loading yours: --extension_modules, entry points
prompt_feeder.py   admission under the lookahead; prompt records (pure)
staleness.py       K (--max_off_policy_steps) and the off-policy action as one policy: age rule, window (pure)
replay_buffer.py   completions -> complete groups -> fixed-size batches; zero-spread and age rules (pure)
batching.py        groups -> advantages, filters, packing, an even per-rank split (pure)
advantages.py      group-relative advantages and zero-std filtering (pure)
loss.py            DAPO clipped loss, KL estimators, truncated importance weights (pure)
packing.py         query+response packing with per-document positions, rank splits (pure)
pacing.py          `Pacing`: the lookahead (--async_steps N or auto) moved with the staleness window
metrics.py         per-step rollout metrics, engine occupancy, async_steps_needed
evaluation.py      eval rounds on the eval mix through the same engines, without stopping training
adapters.py        --use_peft: the LoRA adapter's peft config, served rank, layout, zero adapter, engine folders
checkpoints.py     HF-format checkpoints (keep-last-n) and the resumable run state (versioned, migrated)
traces.py          --save_traces: trained rollouts as JSONL shards, read_traces
tracking.py        metrics.jsonl, wandb (offline without credentials), tqdm, the training plot

Its subpackages, each mapped in its own __init__.py: config/ (every flag, by concern), data/ (datasets,
models, chat templates, the embedded default), generation/ (vLLM engines in Ray actors, the pool, engine
faults), learner/ (DeepSpeed ranks, the reference policy), weights/ (the weight sync and its transports),
rewards/ (verifiers), agents/ (tools and environments), launch/ (what mason.py builds), benchmarks/.
"""

__version__ = "0.1.0"
