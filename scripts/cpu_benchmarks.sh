#!/usr/bin/env bash
# Every benchmark of docs/benchmarks.md on this machine, in order, writing JSON, PNGs and a stamped table (.md) each
# under $OUT (default output/bench): generation, weight_sync, learner_step, replay/, e2e/ (+ measured.json), simulator/
# (fitted to e2e/measured.json), faults/, staleness_learning/, window_sim/, window_cpu/, lora (LoRA vs full),
# e2e_lora/ (e2e's heavy tail with --use_peft), driver_headroom/ (one driver's cost per sample at the original
# request's lengths) and real_length/ (e2e at those lengths, vLLM preempting).
# Hardware: a 2-core x86_64 Linux machine, no GPU: about 145 minutes (its parts: 105 on 2026-12-04, real_length's 40
# on 2026-12-06); QUICK=1 shrinks every benchmark to a smoke run (about 10 minutes; the tests use it). Sets up .venv
# first when needed.
# PUBLISH=1 copies the stamped tables into docs/results/ (one page per benchmark, linked from docs/results/index.md).
# Usage: bash scripts/cpu_benchmarks.sh    or    QUICK=1 OUT=/tmp/bench bash scripts/cpu_benchmarks.sh
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
bash scripts/setup_env.sh
export TOKENIZERS_PARALLELISM=false
py=.venv/bin/python
out="${OUT:-output/bench}"
if [[ "${QUICK:-0}" == "1" ]]; then
  generation=(--prompts 4 --samples 2 --concurrency 4 --median_tokens 8 --max_tokens 32 --kv_cache_gib 0.1)
  weight_sync=(--sizes 128x2 --syncs 1 --running 2 --max_tokens 64 --warmup_s 0.1)
  replay=(--response_lengths 32 96 --max_prompts 4 --samples 2 --kv_cache_gib 0.1)
  e2e=(--steps 2 --rounds 2 --prompts 4 --samples 2 --median_tokens 12 --max_tokens 48 --tool_median_tokens 8
       --tool_latency_s 0.2 --calibrate 1 4)
  simulator=(--projection_steps 2 --async_sweep 1,2)
  learner_step=(--size embedded --prompts 2 --samples 2 --pack_length 256 --steps 1 --parts request_settings micro_batches)
  # Equal lengths of 160 tokens: every sample runs for seconds, so the fault always finds some running.
  faults=(--steps 4 --fault_step 2 --prompts 2 --samples 2 --median_tokens 160 --sigma 0 --max_tokens 160
          --report_tokens 8 --scenarios sigkill_continue)
  staleness=(--seeds 1 --total_episodes 256)
  window_sim=(--steps 8 --fixed 1)
  window_cpu=(--learning_rates 3e-4 --fixed --total_episodes 256)
  e2e_lora=(--steps 2 --rounds 1 --prompts 4 --samples 2 --median_tokens 12 --max_tokens 48)
  lora=(--size embedded --steps 2 --prompts 2 --samples 2 --pack_length 256 --running 2 --max_tokens 48
        --projection_steps 2 --sweep 1 2)
  driver=(--engines 1 --ranks 2 --prompts_per_step 2 --steps 2 --max_tokens 256 --rounds 1 --projection_steps 2 --cluster_steps 2)
  real_length=(--steps 2 --rounds 1 --prompts 2 --samples 4 --median_tokens 256 --max_tokens 1024 --kv_cache_gib 0.006)
else
  generation=() weight_sync=() replay=() e2e=(--steps 24) simulator=() learner_step=() faults=() staleness=() window_sim=()
  window_cpu=() lora=() e2e_lora=(--steps 16) driver=()
  real_length=(--steps 3 --rounds 2 --prompts 2 --samples 4 --median_tokens 4000 --max_tokens 16384 --kv_cache_gib 0.1)
fi
$py -m benchmarks.generation "${generation[@]}" --output "$out/generation.json"
$py -m benchmarks.weight_sync "${weight_sync[@]}" --output "$out/weight_sync.json"
$py -m benchmarks.learner_step "${learner_step[@]}" --output "$out/learner_step.json"
$py -m benchmarks.replay "${replay[@]}" --output "$out/replay"
$py -m benchmarks.e2e "${e2e[@]}" --output "$out/e2e"
$py -m benchmarks.simulator "${simulator[@]}" --measured "$out/e2e/measured.json" --output "$out/simulator"
$py -m benchmarks.faults "${faults[@]}" --output "$out/faults"
$py -m benchmarks.staleness_learning "${staleness[@]}" --output "$out/staleness_learning"
$py -m benchmarks.window_sim "${window_sim[@]}" --output "$out/window_sim"
$py -m benchmarks.window_cpu "${window_cpu[@]}" --output "$out/window_cpu"
$py -m benchmarks.lora "${lora[@]}" --output "$out/lora.json"
$py -m benchmarks.e2e "${e2e_lora[@]}" --use_peft --workloads heavy_tail --modes synchronous streaming \
  --calibrate --output "$out/e2e_lora"
$py -m benchmarks.driver_headroom "${driver[@]}" --output "$out/driver_headroom"
# Long-reasoning lengths on the real stack (lognormal around 4,000 tokens, sigma 0.8, capped at 16,384: the
# long-reasoning shape's, docs/index.md): 8 samples running over a KV cache of 26k tokens (about 6 samples of
# median length), so that vLLM preempts; three modes side by side.
$py -m benchmarks.e2e "${real_length[@]}" --long_context --sigma 0.8 --running_per_engine 8 \
  --workloads heavy_tail --modes synchronous streaming streaming_auto --calibrate --output "$out/real_length"
if [[ "${PUBLISH:-0}" == "1" ]]; then
  mkdir -p docs/results
  for page in generation.md weight_sync.md replay/replay.md e2e/e2e.md simulator/simulator.md faults/faults.md \
    staleness_learning/staleness_learning.md window_sim/window_sim.md window_cpu/window_cpu.md lora.md \
    driver_headroom/driver_headroom.md; do
    cp "$out/$page" "docs/results/$(basename "$page")"
  done
  cp "$out/e2e_lora/e2e.md" docs/results/e2e_lora.md
  cp "$out/real_length/e2e.md" docs/results/real_length.md
fi
