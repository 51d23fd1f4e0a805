"""Small rewarded GRPO groups on the tiny model, for learner and weight-sync tests."""

from __future__ import annotations

from open_instruct.messages import Completion, VersionSpan
from open_instruct.replay_buffer import ReplayBuffer


def rewarded_groups(tokenizer, samples_per_prompt: int = 4):
    """Four addition prompts; even samples answer right (reward 10), odd ones wrong (0)."""
    buffer = ReplayBuffer(samples_per_prompt=samples_per_prompt, max_samples=64)
    for p, (a, b) in enumerate([(3, 4), (5, 2), (1, 1), (6, 3)]):
        prompt = tuple(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": f"What is {a} + {b}?"}], add_generation_prompt=True, tokenize=True
            )["input_ids"]
        )
        for j in range(samples_per_prompt):
            answer = a + b if j % 2 == 0 else a + b + 1
            response = tuple(tokenizer.encode(f"{answer}</think><answer>{answer}</answer>")) + (tokenizer.eos_token_id,)
            buffer.add(
                Completion(
                    prompt_id=f"p{p}@0",
                    sample_index=j,
                    prompt_token_ids=prompt,
                    response_token_ids=response,
                    behaviour_logprobs=(-1.0,) * len(response),
                    finish_reason="stop",
                    version_spans=(VersionSpan(0, 0, len(response)),),
                    admitted_version=0,
                    engine_id=0,
                    reward=10.0 if answer == a + b else 0.0,
                )
            )
    assert buffer.ready(4)
    return buffer.take(4, learner_version=0)
