"""Do the engines generate with the learner's weights? A check that needs no trust in any metric.

A short real training run (grpo_fast's flags; by default 2 steps on the embedded model, with in-flight weight
syncs) is followed by one more sync of the learner's current weights into the running engines. Then every
engine decodes a few prompts greedily, and a transformers model holding the learner's weights (its full state
dict, gathered under ZeRO-3) predicts each next token from the same prefix, in float32: each engine token must
be that model's argmax, or within TIE of it (two logits that close are a tie that kernel order may break
either way). TIE is a float32 tolerance, so TF32 is off on both sides (TF32_OFF, set before Ray or any engine
starts, so every engine process inherits it: cuBLAS by NVIDIA_TF32_OVERRIDE=0, and the fp32 dots of vLLM's
Triton attention, which default to TF32 on sm80+, by TRITON_F32_DEFAULT=ieee; the reference by torch's own
switches). Run by `gpu_check.sh` (part weights_loaded) and, on the CPU stack, by the test suite.

    python scripts/weights_loaded_check.py [grpo_fast flags]    # PASS/FAIL lines; exit 1 on a FAIL
"""

from __future__ import annotations

import logging
import os
import sys

TIE = 1e-3  # logits closer than this are a tie: float32 kernel-order noise, far below TF32's (10-bit mantissa)
TF32_OFF = {"NVIDIA_TF32_OVERRIDE": "0", "TRITON_F32_DEFAULT": "ieee"}
PROMPTS = ("Count from 1 onwards, please.", "What is 17 + 25?", "Name three colours.", "Spell 'weight'.")
TOKENS = 24  # greedy tokens per prompt
DEFAULTS = ["--total_episodes", "32", "--num_unique_prompts_rollout", "4", "--num_samples_per_prompt_rollout", "4"]
DEFAULTS += ["--response_length", "32", "--num_evals", "0", "--save_freq", "0", "--inflight_updates", "True"]


def greedy_requests(tokenizer) -> list:
    from open_instruct.messages import PromptRequest, SamplingSettings

    requests = []
    for k, text in enumerate(PROMPTS):
        messages = [{"role": "user", "content": text}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
        sampling = SamplingSettings(max_tokens=TOKENS, temperature=0.0, ignore_eos=True)
        requests.append(PromptRequest(f"greedy{k}", tuple(ids), (), (), sampling, 1, 0, admitted_version=0))
    return requests


def reference_model(model_path: str, state: dict):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or any("lm_head" not in name for name in missing):
        raise RuntimeError(f"the learner's state does not fit the model: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        model = model.cuda()
    return model


def disagreements(model, prompt_ids: tuple, response_ids: tuple) -> tuple[list[int], int]:
    """Positions where the engine's token is not the reference's argmax (beyond a tie), and the ties."""
    import torch

    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(torch.tensor([list(prompt_ids) + list(response_ids)], device=device)).logits[0].float()
    start = len(prompt_ids) - 1
    wrong, ties = [], 0
    for i, token in enumerate(response_ids):
        row = logits[start + i]
        best = int(row.argmax())
        if best != token:
            if float(row[best] - row[token]) < TIE:
                ties += 1
            else:
                wrong.append(i)
    return wrong, ties


def main(argv: list[str]) -> int:
    os.environ.update(TF32_OFF)  # before anything starts an engine process: they inherit it
    from open_instruct.cluster import Stack
    from open_instruct.config.core import parse_config
    from open_instruct.data.models import load_tokenizer, packing_pad_id, resolve_model_path
    from open_instruct.grpo_fast import load_data, training_loop

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = parse_config([*DEFAULTS, *argv])
    model_path = resolve_model_path(cfg.model.model_name_or_path)
    tokenizer = load_tokenizer(cfg.model)
    train, evaluation = load_data(cfg, tokenizer)
    stack = Stack(cfg, model_path, packing_pad_id(tokenizer, model_path))
    try:
        summary = training_loop(cfg, stack, tokenizer, train, evaluation).run()
        version = stack.sync.version + 1
        stack.sync.sync(version)  # whatever the last step left: the engines now hold the learner's weights
        state = stack.learners.full_state_dict()
        requests = greedy_requests(tokenizer)
        outputs = {i: stack.pool.generate(requests, engine_index=i) for i in stack.pool.member_ids()}
    finally:
        stack.close()
    model = reference_model(model_path, state)
    failed = 0
    for engine_id, completions in outputs.items():
        checked = ties = wrong_prompts = 0
        for completion in completions:
            wrong, tied = disagreements(model, completion.prompt_token_ids, completion.response_token_ids)
            versions = {span.version for span in completion.version_spans}
            checked, ties = checked + len(completion.response_token_ids), ties + tied
            if wrong or versions != {version}:
                wrong_prompts += 1
                print(
                    f"FAIL engine {engine_id} {completion.prompt_id}: tokens {wrong} are not the learner's argmax "
                    f"(versions {sorted(versions)}, expected {version})"
                )
        failed += wrong_prompts
        verdict = "each the learner's argmax" if not wrong_prompts else f"{wrong_prompts} prompt(s) not the learner's"
        print(
            f"{'PASS' if not wrong_prompts else 'FAIL'} engine {engine_id}: {checked} greedy tokens after "
            f"{summary['steps_trained']} steps, {verdict} ({ties} ties within {TIE:g}, TF32 off), "
            f"at weight version {version}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
