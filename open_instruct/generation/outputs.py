"""vLLM requests and outputs <-> our messages: sampling parameters, a finished output as a `Completion`, a
running one as a `SampleProgress` report, and a continued sample's two parts joined into one Completion.

Pure functions of vLLM's output objects (and the tokenizer where text must match tokens), so the engine
actor keeps only its scheduling and lifecycle.
"""

from __future__ import annotations

import time
from dataclasses import replace

from open_instruct.messages import Completion, PartialSample, PromptRequest, SampleProgress, VersionSpan


def from_output(base: Completion, final, request: PromptRequest, first_token_at: float, reason, tokenizer):
    """`base` filled from vLLM's last output of the request (`final`; None when it produced nothing)."""
    if final is None or not final.outputs:
        return replace(base, finish_reason=reason or "error", finished_at=time.time())
    sample = final.outputs[0]
    logprobs = tuple(next(iter(position.values())).logprob for position in (sample.logprobs or []))
    finish = reason or ("stop" if sample.finish_reason == "stop" else sample.finish_reason or "abort")
    token_ids = tuple(sample.token_ids)
    if isinstance(sample.stop_reason, str) and not request.sampling.include_stop_str_in_output:
        token_ids = without_stop_string(token_ids, sample.text, tokenizer)
    return replace(
        base,
        response_token_ids=token_ids,
        behaviour_logprobs=logprobs[: len(token_ids)],
        finish_reason=finish,
        version_spans=spans_of(sample, request.admitted_version),
        response_text=sample.text,
        first_token_at=first_token_at,
        finished_at=time.time(),
    )


def without_stop_string(token_ids: tuple[int, ...], text: str, tokenizer) -> tuple[int, ...]:
    """vLLM strips a stop string from the text but keeps its tokens; drop them too, so the
    tokens trained on are exactly the text the verifier scored."""
    while token_ids and len(tokenizer.decode(token_ids, skip_special_tokens=True)) > len(text):
        token_ids = token_ids[:-1]
    return token_ids


def continued(completion: Completion, kept: PartialSample | None, tokenizer) -> Completion:
    """`completion` after the kept tokens of its interrupted attempt: one response, both parts' spans."""
    if kept is None or not kept.token_ids:
        return completion
    n = len(kept.token_ids)
    tokens = kept.token_ids + completion.response_token_ids
    return replace(
        completion,
        response_token_ids=tokens,
        behaviour_logprobs=kept.logprobs + completion.behaviour_logprobs,
        version_spans=kept.version_spans + shifted(completion.version_spans, n),
        response_text=tokenizer.decode(tokens, skip_special_tokens=True),
        continued_tokens=n,
    )


def progress_report(
    request: PromptRequest, sample_index: int, engine_id: int, sample, since: int, offset: int, kept
) -> SampleProgress:
    """A running output's tokens from `since` on; positions and spans count the kept part (`offset` tokens)."""
    tokens = tuple(sample.token_ids)
    logprobs = tuple(next(iter(p.values())).logprob for p in (sample.logprobs or [])[since : len(tokens)])
    spans = (kept.version_spans if kept is not None else ()) + shifted(
        spans_of(sample, request.admitted_version), offset
    )
    return SampleProgress(request.prompt_id, sample_index, engine_id, offset + since, tokens[since:], logprobs, spans)


def sampling_params(request: PromptRequest, sample_index: int):
    from vllm import SamplingParams

    sampling = request.sampling
    return SamplingParams(
        n=1,
        seed=request.seed + sample_index,
        max_tokens=sampling.max_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        stop=list(sampling.stop_strings) or None,
        include_stop_str_in_output=sampling.include_stop_str_in_output,
        ignore_eos=sampling.ignore_eos,
        logprobs=0,  # the sampled token's own logprob at every position
    )


def spans_of(sample, admitted_version: int) -> tuple[VersionSpan, ...]:
    """The weight versions of a vLLM output's tokens, as spans of response positions."""
    return tuple(
        VersionSpan(parse_version(span.version, admitted_version), span.start, span.end)
        for span in (getattr(sample, "weight_versions", None) or [])
    )


def shifted(spans: tuple[VersionSpan, ...], offset: int) -> tuple[VersionSpan, ...]:
    return tuple(VersionSpan(s.version, s.start + offset, s.end + offset) for s in spans) if offset else spans


def parse_version(raw: str | int | None, default: int) -> int:
    # vLLM labels weights it loaded itself "default"; our versions are stringified ints.
    try:
        return int(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return default
