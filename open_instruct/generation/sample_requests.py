"""One sample as vLLM requests: the request and its progress reports, and a sample that continues from tokens
it already has: a dead engine's or a stopped run's partial (`request.partials`), or its own tokens after a
reprefill sync cut it (`--inflight_update_kv reprefill`). A collaborator of `GenerationActor` over the
engine's declared state (`engine_state.EngineState`), kept apart because the joining rules (tokens, logprobs,
version spans, token counts) are one job."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

from open_instruct.generation.engine_state import EngineState
from open_instruct.generation.outputs import continued, from_output, progress_report
from open_instruct.messages import Completion, PartialSample, PromptRequest

logger = logging.getLogger(__name__)


def _aborted(output) -> bool:
    return bool(output.outputs) and output.outputs[0].finish_reason == "abort"


class SampleRequests:
    """`sampling_params(request, sample_index, turn)`: the actor's hook giving each request's vLLM SamplingParams.
    A subclass may wrap `outputs` (the actor's `requests_class` names it): tests hold a sample there."""

    def __init__(self, state: EngineState, sampling_params: Callable):
        self.state = state
        self.sampling_params = sampling_params

    async def engine_request(self, request: PromptRequest, sample_index: int, part: str = "", turn: int = 0):
        """One vLLM request; the Completion is not scored yet. A single-turn sample interrupted before
        (`request.partials`) continues from prompt + its kept tokens (multi-turn ones restart: tool state)."""
        from vllm.v1.engine.exceptions import EngineDeadError

        state = self.state
        kept = request.partial_of(sample_index) if not part else None
        base = Completion.of_request(request, sample_index, state.engine_id, started_at=time.time())
        if kept is not None:
            versions = [s.version for s in kept.version_spans] or [request.admitted_version]
            state.first_version[(request.prompt_id, sample_index)] = min(versions)
            if len(kept.token_ids) >= request.sampling.max_tokens:  # it had ended when it was interrupted
                return continued(replace(base, finish_reason="length", finished_at=time.time()), kept, state.tokenizer)
        first_token_at, final, interrupted = 0.0, None, kept
        try:
            for attempt in itertools.count():
                epoch = state.reprefill_epoch
                async for output in self.outputs(request, sample_index, part, turn, kept, attempt):
                    if not first_token_at and output.outputs and output.outputs[0].token_ids:
                        first_token_at = time.time()
                        state.first_version.setdefault((request.prompt_id, sample_index), state.weight_version)
                    final = output
                if not (epoch != state.reprefill_epoch and final is not None and _aborted(final)):
                    break
                # A reprefill sync cut it: keep its tokens and logprobs, continue after the resume.
                kept, final = self._kept_through_cut(base, final, request, kept, first_token_at), None
        except asyncio.CancelledError:
            # Aborted (at shutdown, or doomed by the staleness bound): still delivered, marked as such.
            completion = continued(
                from_output(base, final, request, first_token_at, "abort", state.tokenizer), kept, state.tokenizer
            )
            return self._counted(replace(completion, error="aborted"), interrupted)
        except EngineDeadError:
            raise
        except Exception as error:  # the engine rejected this prompt (too long, bad ids, ...)
            logger.warning("prompt %s sample %d failed: %s", request.prompt_id, sample_index, error)
            return replace(base, error=f"{type(error).__name__}: {error}", finished_at=time.time())
        completion = continued(
            from_output(base, final, request, first_token_at, None, state.tokenizer), kept, state.tokenizer
        )
        return self._counted(completion, interrupted)

    def _kept_through_cut(self, base: Completion, final, request: PromptRequest, kept, first_token_at: float):
        """The sample so far, as the part its continuation (prompt + these tokens, one fresh prefill) joins."""
        counters, tokenizer = self.state.counters, self.state.tokenizer
        so_far = continued(from_output(base, final, request, first_token_at, "abort", tokenizer), kept, tokenizer)
        counters.generated_tokens += len(so_far.response_token_ids) - (len(kept.token_ids) if kept else 0)
        counters.reprefilled_samples += 1
        counters.reprefill_tokens += len(request.prompt_token_ids) + len(so_far.response_token_ids)
        return PartialSample(
            so_far.sample_index, so_far.response_token_ids, so_far.behaviour_logprobs, so_far.version_spans
        )

    def _counted(self, completion: Completion, interrupted) -> Completion:
        """Adds its newly generated tokens to the engine's count. `continued_tokens` stays what an earlier
        attempt (a dead engine, a stopped run) left: tokens kept through reprefill cuts were generated here."""
        newly_generated = len(completion.response_token_ids) - completion.continued_tokens  # the last part's
        self.state.counters.generated_tokens += newly_generated
        return replace(completion, continued_tokens=len(interrupted.token_ids) if interrupted else 0)

    async def outputs(
        self, request: PromptRequest, sample_index: int, part: str, turn: int, kept, attempt: int = 0
    ) -> AsyncIterator:
        """The vLLM outputs of one request, reporting progress to the driver every --partial_report_tokens.
        `attempt` counts the reprefill cuts this sample went through (each continuation is a new request)."""
        from vllm.inputs import tokens_input

        state = self.state
        prompt_ids, offset = request.prompt_token_ids, 0
        if kept is not None:
            prompt_ids, offset = prompt_ids + kept.token_ids, len(kept.token_ids)
            request = replace(
                request, sampling=replace(request.sampling, max_tokens=request.sampling.max_tokens - offset)
            )
        params = self.sampling_params(request, sample_index, turn)
        continuation = f"/r{attempt}" if attempt else ""
        request_id = f"{request.prompt_id}/{sample_index}/e{state.engine_id}{part}{continuation}"
        report_every = state.settings.generation.partial_report_tokens if state.results is not None and not part else 0
        # A request submitted during a weight sync would be salted with the outgoing version and
        # could then reuse prefix blocks computed with the old weights: submit after the resume.
        await state.resumed.wait()
        state.counters.submitted_prompt_tokens += len(prompt_ids)
        prompt = tokens_input(list(prompt_ids), cache_salt=f"v{state.weight_version}")
        reported = generated = preemptions = 0
        try:
            async for output in state.engine.generate(
                prompt, params, request_id=request_id, lora_request=state.adapter
            ):
                before, sample = generated, output.outputs[0] if output.outputs else None
                generated = len(sample.token_ids) if sample is not None else 0
                preempted = output.metrics.num_preemptions if output.metrics is not None else 0
                if preempted > preemptions:
                    # vLLM freed this request's KV blocks and prefilled prompt + its tokens again under the
                    # weights loaded then. It tells with the first output after the resume, so the tokens
                    # recomputed are those the sample had before this output (this loop reads each output
                    # during the wait for room, unless its event loop is blocked that long).
                    state.counters.recomputed_tokens += (preempted - preemptions) * (len(prompt_ids) + before)
                    preemptions = preempted
                state.progress[request_id] = offset + generated
                state.counters.token_outputs += 1
                if report_every and generated - reported >= report_every:
                    await state.results.put_async(
                        progress_report(request, sample_index, state.engine_id, sample, reported, offset, kept)
                    )
                    reported = generated
                yield output
        finally:
            state.progress.pop(request_id, None)
