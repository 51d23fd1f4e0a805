"""Benchmarks and the cluster simulator: measured side by side on this machine, projected at cluster scale.

Each module is a command (`python -m benchmarks.<name>`, from the repository root), but for the helpers
they share (`workloads`, `simulated_stack`, `simulator_plots`, `calibration`: the simulator's costs fitted on
measurements, `rounds`: repeated runs as medians with spreads, `stamp`: date, commit and machine of every
result); `scripts/cpu_benchmarks.sh` runs them all. They sit beside the package, not in it: the wheel ships
what a training run needs, and the benchmarks run from a checkout (or the image, whose working directory is
the repository). Nothing in `open_instruct` imports them. They use the core only through its public handles
(`cluster.Stack`, `EnginePool`, `TrainingLoop` and its collaborators), the engine's one benchmark hook,
`GenerationActor.generate_sample` (see `workloads.py`), and its step trace
(`GenerationActor.start_step_trace` / `take_step_trace`).

generation.py          streaming vs fixed-batch generation on heavy-tailed lengths
weight_sync.py         in-flight weight-sync pause vs model size, against the memory-bandwidth bound
learner_step.py        learner step time: pi_old pass, fixed rows vs token budget, checkpointing
lora.py                LoRA (--use_peft) vs full fine-tuning, same model and batch: sync, pause, learner; projected
zero3_memory.py        what a learner rank holds while loading and syncing, ZeRO-2 vs ZeRO-3 (CPU or GPU ranks)
replay.py              a run's recorded prompts replayed through engines only; response-length sweep
e2e.py                 synchronous vs one-step-async vs streaming training on the same prompts
e2e_runs.py            its runs: the modes interleaved in rounds, engine and learner calibration
e2e_reports.py         its tables and timeline plot
faults.py              an engine SIGKILLed (with and without continuation), a stop + resume
staleness_learning.py  the demo once per --off_policy_action and seed: eval gain, length bias, token ages
window_sim.py          --max_off_policy_steps auto vs every fixed K, simulated
window_cpu.py          --max_off_policy_steps auto vs fixed K on the real stack
driver_headroom.py     one driver's cost per sample on the real loop; the largest cluster it serves
simulator.py           the cluster simulator's command: validation on measurements, then the projection
simulation.py          the real TrainingLoop on simulated collaborators: one mode's run, its SimResult
simulated_stack.py     simulated learners and weight sync on a virtual clock; the model of all three
simulated_engines.py   simulated engines: work stealing, decode steps, tool waits, sync pauses
simulated_world.py     what they share: workload, cost model, cluster, the virtual clock and event heap
simulation_replay.py   a measured run's prompts and response lengths, replayed
simulation_validation.py  the simulation against a measured run, mode by mode
simulation_projection.py  the long-reasoning shape (defined here) on assumed H100 costs: async_steps, KV vs re-prefill
simulation_reports.py  the simulator's tables
calibration.py         cost models fitted on measurements
simulator_plots.py     timelines and the async_steps sweep as PNGs
workloads.py           heavy-tailed lengths, forced tool calls and environment turns in a GenerationActor subclass
rounds.py              interleaved rounds of runs -> medians with their spread, ratios per round
stamp.py               date, commit and machine, written into every result
"""
