"""Force one failed weight transfer on the real stack and check that nothing is left broken.

    .venv/bin/python scripts/transfer_failure_check.py [grpo_fast flags ...]

Hardware: the CPU machines (our gloo transport) or a GPU machine (`--vllm_sync_backend nccl`, 2+ GPUs, or
`--single_gpu_mode` on one); scripts/gpu_check.sh runs it there. It builds the stack a run builds (engines,
learners, placement, transport) from the flags, then syncs version 1 with the last weight renamed in the
engines' metadata: every tensor crosses the wire, and the engine's `load_weights` then rejects the unknown
name. That is the engine-side failure path (vLLM ends its update session without finishing the reload) on
either transport, without leaving any rank inside a collective. It checks, and prints one line each:

* the sync fails with an error naming the step, within the sync timeout;
* the engine did not take the version, and still generates (its weights restored, none left on meta);
* a correct sync of version 1 afterwards succeeds and the engine reports it.

Exits 0 when every check passed.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from open_instruct.cluster import Stack
from open_instruct.config.core import parse_config
from open_instruct.data.models import load_tokenizer, packing_pad_id, resolve_model_path
from open_instruct.messages import PromptRequest, SamplingSettings
from open_instruct.weights.transport import WeightSyncError

BOGUS_NAME = "model.not_a_weight_of_this_model"  # vLLM names it without the "model." prefix


def probe(tokenizer, prompt_id: str) -> PromptRequest:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "1 + 1"}], add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    return PromptRequest(
        prompt_id=prompt_id,
        prompt_token_ids=tuple(ids),
        ground_truths=(),
        verifier_names=(),
        sampling=SamplingSettings(max_tokens=8, temperature=0.0, ignore_eos=True),
        num_samples=1,
        seed=0,
        admitted_version=0,
    )


def main(argv: list[str]) -> int:
    cfg = parse_config(argv)
    model_path = resolve_model_path(cfg.model.model_name_or_path)
    tokenizer = load_tokenizer(cfg.model)
    failures = 0

    def check(ok: bool, what: str) -> None:
        nonlocal failures
        failures += not ok
        print(f"{'PASS' if ok else 'FAIL'} {what}", flush=True)

    stack = Stack(cfg, model_path, packing_pad_id(tokenizer, model_path))
    try:
        sync, pool = stack.sync, stack.pool
        good = sync.metadata
        sync.metadata = dataclasses.replace(good, names=(*good.names[:-1], BOGUS_NAME))
        started = time.monotonic()
        try:
            sync.sync(1)
            check(False, "the sync with a bogus weight name failed")
        except WeightSyncError as error:
            elapsed = time.monotonic() - started
            message = str(error)
            named = "step 'transfer'" in message and BOGUS_NAME.removeprefix("model.") in message
            check(named, f"the failed sync names its step and cause, after {elapsed:.1f} s: {message[:120]}...")
        versions = [s.weight_version for s in pool.stats()]
        check(versions == [0] * len(versions), f"no engine took the failed version (versions {versions})")
        [completion] = pool.generate([probe(tokenizer, "after-failure")], timeout_s=120)
        check(len(completion.response_token_ids) == 8, "the engine still generates after the failure")
        sync.metadata = good
        metrics = sync.sync(1)
        versions = [s.weight_version for s in pool.stats()]
        check(versions == [1] * len(versions), f"a correct sync afterwards loads version 1 (versions {versions})")
        [completion] = pool.generate([probe(tokenizer, "after-retry")], timeout_s=120)
        check(
            [s.version for s in completion.version_spans] == [1],
            f"and the engine serves it (pause {metrics['time/weight_sync_pause_s']:.2f} s)",
        )
    finally:
        stack.close()
    print(f"transfer_failure_check: {failures} check(s) failed")
    return int(failures > 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
