"""Benchmarks and the cluster simulator: measured side by side on this machine, projected at cluster scale.

Each module is a command (`python -m open_instruct.benchmarks.<name>`), but for the helpers they share
(`workloads`, `simulated_stack`, `simulator_plots`, `calibration`: the simulator's costs fitted on
measurements, `rounds`: repeated runs as medians with spreads, `stamp`: date, commit and machine of every
result); `scripts/cpu_benchmarks.sh` runs them all. They use the core only through its public handles
(`cluster.Stack`, `EnginePool`, `TrainingLoop` and its collaborators), the engine's one benchmark hook,
`GenerationActor.generate_sample` (see `workloads.py`), and its step trace
(`GenerationActor.start_step_trace` / `take_step_trace`).
"""
