"""A whole `--use_peft` run on the real stack: the learner trains the adapter, every weight sync moves the adapter
alone into the running engines (in flight, requests keeping their KV cache), and an engine that dies during a
sync is left out and replaced while the sync runs again without it; the run trains to the end and saves the
adapter. That a replacement serves the current adapter once it joins: tests/integration/test_lora.py."""

from __future__ import annotations

import json

from helpers.runs import COMMON, read_jsonl

STEPS = 4


def test_a_lora_run_syncs_the_adapter_in_flight_and_survives_an_engine_dying_in_a_sync(tmp_path, model_path):
    from helpers.fault_actors import DiesInWeightSyncActor

    from open_instruct import adapters
    from open_instruct.config.core import parse_config
    from open_instruct.grpo_fast import run
    from open_instruct.weights import adapter_names

    args = list(COMMON)
    args[args.index("--total_episodes") + 1] = str(STEPS * 32)
    args += ["--use_peft", "--lora_r", "8", "--learning_rate", "3e-3", "--vllm_num_engines", "2"]
    args += ["--save_freq", str(STEPS), "--output_dir", str(tmp_path / "out")]
    cfg = parse_config(args)
    marker = tmp_path / "engine_1_died"
    summary = run(cfg, engine_class=DiesInWeightSyncActor, engine_args=((1, 2, str(marker)),))
    assert marker.exists() and summary["status"] == "completed"

    metrics = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert [m["training_step"] for m in metrics] == list(range(STEPS))
    assert metrics[-1]["engines/restarts_total"] == 1
    shapes, _ = adapters.layout(model_path, cfg.model)
    adapter_bytes = sum(4 * a * b for a, b in shapes.values())
    assert {m["weight_sync/bytes"] for m in metrics} == {adapter_bytes}  # the adapter, never the base
    # Whether a sync lands mid-generation here is a matter of timing: tests/integration/test_lora.py asserts it
    # without (an adapter update keeps both running requests); this run checks the gauges' ranges.
    assert all(0 <= m["staleness/multi_version_frac"] <= 1 and m["weight_sync/kept_requests"] >= 0 for m in metrics)
    saved = tmp_path / "out" / "checkpoints" / f"step_{STEPS}"
    assert json.loads((saved / "adapter_config.json").read_text())["r"] == 8
    assert (saved / adapter_names.ADAPTER_FILE).exists() and not (saved / "model.safetensors").exists()
