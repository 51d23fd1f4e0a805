"""Scoring a finished sample inside the engine's actor, off its event loop (the reward pool's workers), so
scoring overlaps generation."""

from __future__ import annotations

from dataclasses import replace

from open_instruct.messages import Completion, PromptRequest


async def scored(
    scorer, reward_settings, agent_settings, tokenizer, completion: Completion, request: PromptRequest
) -> Completion:
    """`completion` with its reward: the verifiers' score, and for a multi-turn sample the agent's aggregation
    (`agents.rollout.agent_reward`) of that score, the format reward and the turns' rewards."""
    outcome = await scorer.score(
        f"{completion.prompt_id}/{completion.sample_index}",
        completion.response_text,
        list(request.ground_truths),
        list(request.verifier_names),
        completion.finish_reason,
        len(completion.response_token_ids),
        query=tokenizer.decode(request.prompt_token_ids, skip_special_tokens=True),
    )
    reward = outcome.reward
    if completion.agent is not None:
        from open_instruct.agents.rollout import agent_reward
        from open_instruct.rewards.scoring import has_think_answer_format

        formatted = has_think_answer_format(completion.response_text)
        format_part = reward_settings.reward.format_reward if formatted else 0.0
        penalised = reward_settings.reward.non_stop_penalty and completion.finish_reason != "stop"
        reward = agent_reward(
            reward,
            format_part,
            completion.agent,
            agent_settings.tools.reward_aggregator,
            agent_settings.tools.only_reward_good_outputs,
            penalised,
        )
    return replace(
        completion,
        reward=reward,
        verifier_scores=dict(outcome.per_verifier),
        reward_errors=tuple(outcome.errors),
    )
