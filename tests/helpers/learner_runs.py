"""Runs of a real 2-rank DeepSpeed learner group (gloo, Ray actors, the tiny model) that tests compare, each
configuration trained once per module (`run_group`), and the checks that tests/integration and tests/nightly
both run on them. The caller's module holds the Ray cluster."""

from __future__ import annotations

import pytest

from open_instruct import batching
from open_instruct.batching import assemble


def run_group(
    model_path,
    groups,
    stage: int,
    steps: int = 1,
    num_mini_batches: int = 1,
    extras=None,
    token_budget: int = 0,
    **learner_options,
):
    """(weights before, each rank's weights after, metrics per step, batch stats) of `steps` steps of a fresh
    2-rank group. Without `extras` the result is shared by the tests that ask for the same configuration:
    they compare against it and never change it."""
    shape = (stage, steps, num_mini_batches, token_budget)
    if extras is not None:
        return _train_fresh(model_path, groups, *shape, extras, learner_options)
    key = (model_path, *shape, tuple(sorted(learner_options.items())))
    if key not in _TRAINED:
        _TRAINED[key] = _train_fresh(model_path, groups, *shape, None, learner_options)
    return _TRAINED[key]


_TRAINED: dict[tuple, tuple] = {}


def _train_fresh(model_path, groups, stage, steps, num_mini_batches, token_budget, extras, learner_options):
    import ray

    from open_instruct import cluster
    from open_instruct.learner.actor import learner_settings
    from open_instruct.learner.deepspeed_setup import learner_threads, on_gpu, usable_cores

    taken, tokenizer = groups
    settings = learner_settings(
        model_path,
        total_steps=steps,
        deepspeed_stage=stage,
        learning_rate=1e-3,
        lr_scheduler_type="constant",
        num_mini_batches=num_mini_batches,
        truncated_importance_sampling_ratio_cap=0.0,
        **{"beta": 0.0, **learner_options},
    )
    batch_settings = batching.batch_settings(
        tokenizer.pad_token_id,
        pack_length=128,
        num_learners_per_node=[2],
        per_device_train_batch_size=1,
        num_mini_batches=num_mini_batches,
        micro_batch_token_budget=token_budget,
    )
    with cluster.learner_group_for_a_while(settings, batch_settings, 2) as learners:
        info = learners.setup()
        assert [i.zero_stage for i in info] == [stage, stage] and [i.rank for i in info] == [0, 1]
        # Under Ray's defaults (OMP_NUM_THREADS=1 for a num_cpus=1 actor) each rank still gets its share.
        share = learner_threads(on_gpu(), usable_cores(), node_learners=2, world_size=2)
        assert [i.threads for i in info] == [share, share]
        if extras is not None:
            extras["storage"] = ray.get([actor.parameter_storage.remote() for actor in learners.actors])
        before = learners.full_state_dict()  # a collective under ZeRO-3: every rank takes part
        history = []
        for step in range(steps):
            batches, stats = assemble(taken, step, batch_settings)
            assert len(batches) == 2 and len(batches[0].micro_batches) == len(batches[1].micro_batches)
            report = learners.train_step(taken, step)
            assert report.trained_tokens == stats.trained_tokens and report.finished_at >= report.started_at
            history.append(report.metrics)
        # Per rank, to compare the data-parallel replicas.
        after = ray.get([actor.full_state_dict.remote() for actor in learners.actors])
        if extras is not None and learner_options.get("beta"):  # a collective under ZeRO-3, as above
            extras["reference"] = ray.get([actor.reference_state_dict.remote() for actor in learners.actors])[0]
        return before, after, history, stats


def pi_old_matches_the_separate_pass(model_path, groups, stage: int) -> None:
    """One mini-batch, two epochs: the first training forward's detached logprobs replace the no-grad pass;
    the losses and the updated weights are those of the separate pass, to float tolerance."""
    _, (separate, _), history_separate, _ = run_group(
        model_path, groups, stage=stage, num_epochs=2, separate_old_logprob_pass=True
    )
    _, (reused, _), history_reused, _ = run_group(model_path, groups, stage=stage, num_epochs=2)
    for key in ("loss/policy_avg", "policy/ratio_avg", "policy/clipfrac_avg"):
        assert history_reused[0][key] == pytest.approx(history_separate[0][key], abs=1e-6), key
    assert max((separate[n] - reused[n]).abs().max().item() for n in separate) < 1e-6
