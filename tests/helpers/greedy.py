"""Greedy requests and their transformers references, for the tests that prove an in-flight update token by
token (full weights in test_weight_sync.py, the LoRA adapter in test_lora.py)."""

from __future__ import annotations

import time

import ray
import torch

from open_instruct.messages import PromptRequest, SamplingSettings


def greedy(tokenizer, text: str, max_tokens: int, prompt_id: str) -> PromptRequest:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    return PromptRequest(
        prompt_id=prompt_id,
        prompt_token_ids=tuple(ids["input_ids"]),
        ground_truths=(),
        verifier_names=(),
        sampling=SamplingSettings(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
        num_samples=1,
        seed=0,
        admitted_version=0,
    )


@torch.no_grad()
def continue_greedy(model_prefix, model_new, prompt_ids, generated, switch_at: int, count: int) -> list[int]:
    """KV of prompt + generated[:switch_at-1] from `model_prefix`, then `count` greedy tokens from `model_new`."""
    past = model_prefix(
        torch.tensor([list(prompt_ids) + list(generated[: switch_at - 1])]), use_cache=True
    ).past_key_values
    token, out = generated[switch_at - 1], []
    for _ in range(count):
        logits = model_new(torch.tensor([[token]]), past_key_values=past, use_cache=True)
        past, token = logits.past_key_values, int(logits.logits[0, -1].argmax())
        out.append(token)
    return out


@torch.no_grad()
def kept_kv_logprobs(model_prefix, model_new, prompt_ids, generated, switch_at: int) -> list[float]:
    """The logprob of each of generated[switch_at:] under `model_new` decoding over `model_prefix`'s KV of prompt +
    generated[:switch_at-1] (one forward: decoding token by token appends the same KV)."""
    past = model_prefix(
        torch.tensor([list(prompt_ids) + list(generated[: switch_at - 1])]), use_cache=True
    ).past_key_values
    logits = model_new(torch.tensor([list(generated[switch_at - 1 : -1])]), past_key_values=past).logits[0]
    return _picked(logits, generated[switch_at:])


@torch.no_grad()
def whole_text_logprobs(model, prompt_ids, generated) -> list[float]:
    """The logprob of each generated token under `model` reading prompt + generated afresh (a full recompute)."""
    logits = model(torch.tensor([list(prompt_ids) + list(generated)])).logits[0, len(prompt_ids) - 1 : -1]
    return _picked(logits, generated)


def _picked(logits, tokens) -> list[float]:
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, torch.tensor(list(tokens))[:, None])[:, 0].tolist()


@torch.no_grad()
def fresh_greedy(model, prompt_ids, count: int) -> list[int]:
    past = None
    ids = torch.tensor([list(prompt_ids)])
    out = []
    for _ in range(count):
        result = model(ids, past_key_values=past, use_cache=True)
        past, token = result.past_key_values, int(result.logits[0, -1].argmax())
        out.append(token)
        ids = torch.tensor([[token]])
    return out


def wait_until_running(
    actors: list, count: int, min_tokens: int, every_engine: bool = True, timeout_s: float = 120
) -> list[dict[str, int]]:
    """Until every engine (or, with `every_engine` False, any one) runs `count` requests with `min_tokens`
    each. All engines are watched together. A test that only needs something running at a sync waits for any
    engine: on a loaded machine one engine's request may finish before another's has started (seen in CI)."""
    deadline = time.monotonic() + timeout_s
    reached = all if every_engine else any
    while time.monotonic() < deadline:
        progress = ray.get([actor.running_tokens.remote() for actor in actors])
        if reached(len(p) == count and min(p.values()) >= min_tokens for p in progress):
            return progress
        time.sleep(0.05)
    raise AssertionError(f"requests did not reach {min_tokens} tokens: {progress}")


def assert_kept_kv_switch(
    completion, old, new, at_trigger: dict, switch_after: int, until: int | None = None
) -> tuple[int, list[int]]:
    """One completion of an in-flight update from version 0 to 1 that kept its KV cache: its tokens before the
    switch are `old`'s greedy tokens, the rest (up to token `until`, all by default) are `new`'s decoding over
    `old`'s KV prefix. The switch came after the `switch_after` tokens it had when the sync began (`at_trigger`,
    from `wait_until_running`). Returns the switch and the kept-KV continuation."""
    spans = [(s.version, s.start, s.end) for s in completion.version_spans]
    assert [v for v, _, _ in spans] == [0, 1], spans
    switch, length = spans[1][1], len(completion.response_token_ids)
    assert switch_after <= switch < length and switch >= at_trigger[f"{completion.prompt_id}/0/e0"]
    generated = list(completion.response_token_ids)
    assert generated[:switch] == fresh_greedy(old, completion.prompt_token_ids, switch)
    kept = continue_greedy(old, new, completion.prompt_token_ids, generated, switch, length - switch)
    until = length if until is None else until
    assert generated[switch:until] == kept[: until - switch]  # old-weight KV prefix, new-weight decoding
    return switch, kept


def sync_mid_generation(
    engine, sync, tokenizer, version: int, length: int, switch_after: int, label: str, starts=(1, 7)
) -> tuple[dict[str, int], dict[str, float], list]:
    """Greedy counting requests of `length` tokens on `engine`, one per start; once each has `switch_after`
    tokens, `sync` syncs `version`. Returns the tokens each had at the trigger (`wait_until_running`), the
    sync's metrics and the completions."""
    requests = [greedy(tokenizer, f"Count from {n} onwards, please.", length, f"{label}{n}") for n in starts]
    generating = engine.generate.remote(requests)
    [at_trigger] = wait_until_running([engine], count=len(requests), min_tokens=switch_after)
    metrics = sync.sync(version, step_end_time=time.time())
    return at_trigger, metrics, ray.get(generating, timeout=600)


def assert_reprefilled_switch(completion, version: int, old, new, length: int) -> int:
    """One completion of an in-flight update from `version` in re-prefill mode: its tokens before the switch are
    `old`'s greedy tokens, the rest `new`'s continuation of prompt + those tokens prefilled again under `new`.
    Returns the switch."""
    spans = [(s.version, s.start, s.end) for s in completion.version_spans]
    assert [v for v, _, _ in spans] == [version, version + 1], spans
    switch = spans[1][1]
    generated = list(completion.response_token_ids)
    assert len(generated) == length
    assert generated[:switch] == fresh_greedy(old, completion.prompt_token_ids, switch)
    recomputed = continue_greedy(new, new, completion.prompt_token_ids, generated, switch, length - switch)
    assert generated[switch:] == recomputed  # the kept tokens prefilled again under the new weights
    return switch
