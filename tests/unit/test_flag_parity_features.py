"""The open-instruct flags that used to be refused and now do what their names say: logging cadence, state
saving and resuming, dtype / attention / weight-decay groups, the tokenizer rules, forced cache keys,
the length-verifier normaliser, no-effect warnings, and evolving rubrics with the `rubric` verifier.

Pure logic runs in-process; the loop runs through tests/helpers/fakes.py; judges and rubric writers are small
HTTP servers started here (the real vLLM server is in tests/nightly/test_llm_judge_server.py)."""

from __future__ import annotations

import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from helpers import fakes

from open_instruct import checkpoints
from open_instruct.config.core import ConfigError, parse_config, unsupported_features
from open_instruct.config.derived import resolve_dtype, state_save_every
from open_instruct.data.dataset import PromptRow
from open_instruct.rewards import RewardSettings, VerifierInput
from open_instruct.tracking import MetricWindow

# ----------------------------------------------------------------------------- logging and saving


def test_logging_steps_averages_numbers_over_each_window_and_keeps_the_rest():
    window = MetricWindow(every=2)
    assert window.add({"training_step": 0, "loss": 1.0, "name": "a"}) is None
    merged = window.add({"training_step": 1, "loss": 3.0, "eval/reward": 5.0, "name": "b"})
    assert merged == {"training_step": 1, "loss": 2.0, "eval/reward": 5.0, "name": "b"}
    assert window.add({"training_step": 2, "loss": 7.0}) is None
    assert window.flush() == {"training_step": 2, "loss": 7.0} and window.flush() is None
    with pytest.raises(ConfigError, match="--logging_steps 0"):
        parse_config(["--logging_steps", "0"])


def test_state_is_saved_at_every_interval_given_and_checkpointing_steps_only_when_written(tmp_path):
    state = ["--checkpoint_state_dir", str(tmp_path)]
    # --checkpointing_steps's default 500 does not switch saving on (open-instruct's grpo_fast ignores the flag)
    assert state_save_every(parse_config(state)) == (200,)
    assert state_save_every(parse_config([*state, "--checkpointing_steps", "500"])) == (200, 500)
    cfg = parse_config([*state, "--checkpoint_state_freq", "6", "--ephemeral_save_interval", "4"])
    assert state_save_every(cfg) == (4, 6)


def test_checkpointing_steps_saves_state_and_resume_from_checkpoint_continues_from_it(tmp_path):
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    first = fakes.build(fakes.config("--checkpointing_steps", "2", "--checkpoint_state_dir", str(first_dir), steps=3))
    assert first.loop.run()["status"] == "completed"
    assert (first_dir / "latest").read_text() == "step_2"
    # Resume from one step folder; new states go to another directory.
    flags = ("--resume_from_checkpoint", str(first_dir / "step_2"), "--checkpoint_state_dir", str(second_dir))
    second = fakes.build(fakes.config(*flags, "--checkpoint_state_freq", "4", steps=6))
    assert second.loop.run()["status"] == "completed"
    assert [h["training_step"] for h in second.log.history] == [2, 3, 4, 5]
    assert second.learners.version == 6 and (second_dir / "latest").read_text() == "step_4"
    with pytest.raises(ConfigError, match=r"--resume_from_checkpoint .*no resumable state"):
        parse_config(["--resume_from_checkpoint", str(tmp_path / "empty")])


@pytest.mark.parametrize(
    ("keep", "left"), [(2, ["step_3", "step_4"]), (0, ["step_4"]), (-1, ["step_1", "step_2", "step_3", "step_4"])]
)
def test_keep_last_n_checkpoints_prunes_states_but_never_the_fresh_one(tmp_path, keep, left):
    flags = ("--checkpoint_state_freq", "1", "--checkpoint_state_dir", str(tmp_path), "--keep_last_n_checkpoints")
    fakes.build(fakes.config(*flags, str(keep), steps=5)).loop.run()
    assert sorted(p.name for p in tmp_path.glob("step_*")) == left
    assert (tmp_path / "latest").read_text() == "step_4"


def test_no_effect_flags_are_accepted_and_named_in_a_warning():
    cfg = parse_config(["--compile_model", "False", "--gradient_accumulation_steps", "4", "--max_seq_length", "4096"])
    lines = cfg.compat.ignored()
    assert lines == [
        "--gradient_accumulation_steps 4 has no effect: gradients accumulate over every micro-batch of a mini-batch",
        "--compile_model False has no effect: OLMo-core only",
    ]
    assert unsupported_features(cfg) == []
    with pytest.raises(ConfigError, match="--fsdp_shard_degree 3 must divide the 2 learners"):
        parse_config(["--num_learners_per_node", "2", "--fsdp_shard_degree", "3"])


# ----------------------------------------------------------------------------- model and optimizer


def test_dtype_is_explicit_or_model_dtype_on_gpu_or_fp32_on_cpu():
    assert resolve_dtype(None, "bfloat16", on_gpu=False) == "float32"
    assert resolve_dtype(None, "float16", on_gpu=True) == "float16"
    assert resolve_dtype("bfloat16", "float16", on_gpu=False) == "bfloat16"
    with pytest.raises(ConfigError, match="--dtype fp8"):
        parse_config(["--dtype", "fp8"])
    from open_instruct.grpo_fast import checked_config

    with pytest.raises(ConfigError, match="--attn_implementation flash_2 needs the flash-attn package"):
        checked_config(["--attn_implementation", "flash_2"])


def test_dtype_and_attention_backend_reach_the_engine_and_the_learner(model_path):
    from open_instruct.generation.engine_setup import EngineSettings, engine_args
    from open_instruct.learner.actor import LearnerSettings

    cfg = parse_config(["--dtype", "bfloat16", "--vllm_attention_backend", "CPU_ATTN", "--attn_implementation", "te"])
    args = engine_args(EngineSettings.from_config(cfg, model_path))
    assert args.dtype == "bfloat16" and args.attention_backend == "CPU_ATTN"
    assert engine_args(EngineSettings.from_config(parse_config([]), model_path)).attention_backend is None
    learner = LearnerSettings.from_config(cfg, model_path)
    assert (learner.model.dtype, learner.attn_implementation) == ("bfloat16", "sdpa")
    # Judged by vLLM's own list at launch, before anything loads (configuration never imports vLLM).
    from open_instruct.grpo_fast import launch_problems

    assert launch_problems(cfg) == []
    [problem] = launch_problems(parse_config(["--vllm_attention_backend", "NOPE"]))
    assert problem.startswith("--vllm_attention_backend NOPE is not a vLLM attention backend")


def test_weight_decay_skips_biases_and_norms_unless_told_otherwise(model_path):
    from transformers import AutoModelForCausalLM

    from open_instruct.learner.actor import LearnerSettings
    from open_instruct.learner.deepspeed_setup import weight_decay_groups

    model = AutoModelForCausalLM.from_pretrained(model_path)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed, exempt = weight_decay_groups(model.named_parameters(), 0.1, decay_bias_and_norm=False)
    assert decayed["weight_decay"] == 0.1 and exempt["weight_decay"] == 0.0
    assert all("norm" in names[id(p)] or "bias" in names[id(p)] for p in exempt["params"])
    assert not any("norm" in names[id(p)] or "bias" in names[id(p)] for p in decayed["params"])
    # open-instruct's False gives torch's 0.01 to everything; here it is --weight_decay for everything.
    (everything,) = weight_decay_groups(model.named_parameters(), 0.1, decay_bias_and_norm=True)
    assert everything["weight_decay"] == 0.1 and len(everything["params"]) == len(names)
    cfg = parse_config(["--set_weight_decay_on_bias_and_norm", "False"])
    assert LearnerSettings.from_config(cfg, model_path).learner.set_weight_decay_on_bias_and_norm is False


# ----------------------------------------------------------------------------- tokenizer and data


@pytest.fixture
def pad_is_eos_tokenizer(model_path, tmp_path):
    """The embedded tokenizer, saved with its pad token set to EOS (as many base models ship)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.pad_token = tokenizer.eos_token
    tokenizer.save_pretrained(tmp_path / "tok")
    shutil.copy(Path(model_path) / "config.json", tmp_path / "tok" / "config.json")
    return str(tmp_path / "tok")


@pytest.mark.parametrize(
    ("fn", "adds_pad"),
    [
        ("get_tokenizer_simple_v1", False),
        ("get_tokenizer_tulu_v1", False),
        ("get_tokenizer_tulu_v2_1", True),
        ("get_tokenizer_tulu_v2_2", True),
    ],
)
def test_get_tokenizer_fn_pad_rules(pad_is_eos_tokenizer, fn, adds_pad):
    from open_instruct.data.models import load_tokenizer, packing_pad_id

    cfg = parse_config(["--tokenizer_name", pad_is_eos_tokenizer, "--get_tokenizer_fn", fn, "--use_slow_tokenizer"])
    tokenizer = load_tokenizer(cfg.model)
    assert (tokenizer.pad_token == "<pad>") is adds_pad
    assert (tokenizer.pad_token_id != tokenizer.eos_token_id) is adds_pad
    # An added <pad> lies past the model's embeddings, so packs are filled with EOS (masked either way).
    assert packing_pad_id(tokenizer, pad_is_eos_tokenizer) == tokenizer.eos_token_id
    from open_instruct.grpo_fast import checked_config

    with pytest.raises(ConfigError, match="--get_tokenizer_fn get_tokenizer_v9"):
        checked_config(["--get_tokenizer_fn", "get_tokenizer_v9"])


def test_dataset_config_hash_reloads_the_recorded_mix_without_reading_the_source(model_path, tmp_path):
    from open_instruct.data.dataset import DatasetError, load_prompt_dataset
    from open_instruct.data.models import load_tokenizer

    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(
            json.dumps(
                {
                    "messages": [{"role": "user", "content": f"What is {i} + 1?"}],
                    "ground_truth": str(i + 1),
                    "dataset": "gsm8k",
                }
            )
            + "\n"
            for i in range(6)
        )
    )
    cache = tmp_path / "cache"
    cfg = parse_config(["--dataset_mixer_list", str(rows), "1.0", "--dataset_local_cache_dir", str(cache)])
    tokenizer = load_tokenizer(cfg.model)
    first = load_prompt_dataset(cfg.train_data, cfg.model, tokenizer, "train")
    assert first.report.mix_key and first.report.mix_key in first.report.summary()
    rows.unlink()  # the forced key never reads the source
    forced = parse_config(["--dataset_config_hash", first.report.mix_key, "--dataset_local_cache_dir", str(cache)])
    again = load_prompt_dataset(
        forced.train_data, forced.model, tokenizer, "train", forced_cache_key=forced.data.dataset_config_hash
    )
    assert [p.prompt_token_ids for p in again.prompts] == [p.prompt_token_ids for p in first.prompts]
    assert [p.ground_truths for p in again.prompts] == [p.ground_truths for p in first.prompts]
    with pytest.raises(DatasetError, match="--dataset_config_hash feedbeef: no cached train mix"):
        load_prompt_dataset(forced.train_data, forced.model, tokenizer, "train", forced_cache_key="feedbeef")
    with pytest.raises(ConfigError, match="--dataset_transform_fn sft_tokenize_v1"):
        parse_config(["--dataset_transform_fn", "sft_tokenize_v1", "sft_filter_v1"])


def test_max_length_verifier_max_length_is_the_divisor_when_given():
    from open_instruct.rewards.length import max_length, up_to_max_length

    default = RewardSettings.from_config(parse_config([]))
    given = RewardSettings.from_config(parse_config(["--max_length_verifier_max_length", "1000"]))
    assert default.max_length_normalizer is None and given.max_length_normalizer == 1000.0
    inp = VerifierInput(prediction="", ground_truth="100", response_token_count=300)
    assert max_length(inp, default).score == 0.0  # |300 - 100| / 100, clipped
    assert max_length(inp, given).score == pytest.approx(0.8)  # 1 - 200 / 1000
    assert up_to_max_length(inp, given).score == pytest.approx(0.8)


# ----------------------------------------------------------------------------- evolving rubrics


class _ScriptedLLM(BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint: rubric writers get `writer_reply`, criterion judges `judge_scores`."""

    writer_reply = (
        '{"positive_rubrics": [{"title": "Shows work", "description": "Explains each step."}], '
        '"negative_rubrics": [{"title": "Wrong sum", "description": "States a wrong total."}]}'
    )
    judge_scores: ClassVar[dict[str, int]] = {"Explains each step.": 2, "States a wrong total.": 0, "Is correct.": 1}
    prompts: ClassVar[list[str]] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][0]["content"]
        type(self).prompts.append(prompt)
        if "<criterion>" in prompt:
            criterion = prompt.split("<criterion>")[1].split("</criterion>")[0]
            if criterion not in self.judge_scores:
                self.send_response(500)
                self.end_headers()
                return
            content = json.dumps({"score": self.judge_scores[criterion]})
        else:
            content = self.writer_reply
        payload = json.dumps({"choices": [{"message": {"content": content}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def scripted_llm(monkeypatch):
    _ScriptedLLM.prompts = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ScriptedLLM)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    monkeypatch.setenv("LLM_JUDGE_BASE_URL", url)
    yield url
    server.shutdown()


def rubric_truth(query: str, *descriptions: str) -> str:
    return json.dumps({"query": query, "rubrics": [{"description": d, "weight": 1.0} for d in descriptions]})


def test_the_rubric_verifier_weights_each_criterion_and_negative_rubrics_subtract(scripted_llm):
    from open_instruct.rewards.rubric import rubric

    settings = RewardSettings(judge_base_url=scripted_llm)
    truth = json.dumps(
        {
            "query": "2+2?",
            "rubrics": [
                {"description": "Explains each step.", "weight": 2.0},
                {"description": "Is correct.", "weight": 1.0},
                {"description": "States a wrong total.", "weight": -1.0},
            ],
        }
    )
    result = rubric(
        VerifierInput(prediction="<think>x</think><answer>4, since 2+2=4</answer>", ground_truth=[truth]), settings
    )
    assert result.score == pytest.approx((1.0 * 2 + 0.5 * 1 + 0.0 * -1) / 4)
    assert "<response>4, since 2+2=4</response>" in _ScriptedLLM.prompts[-1]  # the <answer> block is graded
    # One failing criterion scores 0 and keeps its weight; all failing is the verifier's error.
    partial = json.dumps({"query": "q", "rubrics": [{"description": "Is correct."}, {"description": "unknown"}]})
    assert rubric(VerifierInput("a", partial), settings).score == pytest.approx(0.25)
    with pytest.raises(RuntimeError, match="every rubric judge call failed"):
        rubric(VerifierInput("a", rubric_truth("q", "unknown")), settings)


def test_the_rubric_book_caps_active_rubrics_oldest_first_and_never_caps_the_datasets():
    from open_instruct.rewards.evolving_rubrics import RubricBook, parse_generated
    from open_instruct.rewards.rubric import parse_rubric_truth

    truth = parse_rubric_truth(rubric_truth("q", "Own rubric."))
    book = RubricBook(max_active=2)
    for k in range(3):
        book.add(truth, [{"description": f"new {k}", "weight": 1.0, "title": ""}])
    entry = book.entry(truth)
    assert [r["description"] for r in entry.active] == ["new 1", "new 2"] and entry.retired[0]["description"] == "new 0"
    rebuilt = json.loads(book.ground_truth(truth))
    assert [r["description"] for r in rebuilt["rubrics"]] == ["Own rubric.", "new 1", "new 2"]
    assert rebuilt["rubrics_types"] == ["persistent", "evolving", "evolving"]
    assert parse_generated('noise {"positive_rubrics": [], "negative_rubrics": [{"description": "Bad."}]} end') == [
        {"description": "Bad.", "weight": -1.0, "title": ""}
    ]
    assert parse_generated("no json here") is None
    assert parse_generated('{"positive_rubrics": [{"title": "no description"}]}') is None


def rubric_rows(count: int) -> list[PromptRow]:
    return [
        PromptRow("fake:rubric", i, (1, 2, 3 + i), (rubric_truth(f"question {i}", "Is correct."),), ("rubric",))
        for i in range(count)
    ]


def test_evolving_rubrics_reach_later_requests_and_survive_a_resume(scripted_llm, tmp_path, monkeypatch):
    dump = tmp_path / "dump"
    flags = (
        "--apply_evolving_rubric_reward",
        "--max_active_rubrics",
        "1",
        "--cache_evolving_rubric_data_dir",
        str(dump),
        "--checkpoint_state_freq",
        "2",
        "--checkpoint_state_dir",
        str(tmp_path / "state"),
    )
    # Two rows, one prompt per step: each row comes back every other step, after its rubrics were written.
    run = fakes.build(fakes.config(*flags, "--async_steps", "0", steps=4, prompts=1), train_rows=rubric_rows(2))
    run.loop.run()
    history = run.log.history
    assert history[0]["evolving_rubrics/groups"] == 1.0 and history[0]["evolving_rubrics/skipped"] == 0.0
    assert history[0]["evolving_rubrics/num_new_rubrics"] == 2.0
    requests = [r for _, r in run.engines.submitted]
    first_of_row = {}
    for request in requests:
        first_of_row.setdefault(request.prompt_id.split("@")[0], request)
    later = [r for r in requests if r is not first_of_row[r.prompt_id.split("@")[0]]]
    assert later, "each row must be admitted again after its first step"
    for request in later:
        truth = json.loads(request.ground_truths[0])
        # The dataset's rubric stays; of the two new ones only the newest is active (--max_active_rubrics 1).
        assert [r["description"] for r in truth["rubrics"]] == ["Is correct.", "States a wrong total."]
        assert truth["rubrics_types"] == ["persistent", "evolving"]
    assert "Existing rubrics:\n[]" in _ScriptedLLM.prompts[0]
    assert len(list(dump.glob("evolving_rubrics_step*.json"))) == 4
    _, state = checkpoints.latest_state(str(tmp_path / "state"))
    queries, overrides = state.rubrics
    assert set(queries) == {"question 0", "question 1"} and set(overrides) == {"fake:rubric:0", "fake:rubric:1"}
    monkeypatch.delenv("LLM_JUDGE_BASE_URL")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ConfigError, match="LLM_JUDGE_BASE_URL"):
        parse_config(["--apply_evolving_rubric_reward"])


def test_a_failing_rubric_writer_skips_the_group_and_training_goes_on(monkeypatch):
    monkeypatch.setenv("LLM_JUDGE_BASE_URL", "http://127.0.0.1:9/v1")  # nothing listens there
    run = fakes.build(
        fakes.config("--apply_evolving_rubric_reward", "--llm_judge_timeout", "2", steps=2, prompts=1),
        train_rows=rubric_rows(4),
    )
    assert run.loop.run()["status"] == "completed"
    assert [h["evolving_rubrics/skipped"] for h in run.log.history] == [1.0, 1.0]
    assert all(
        r.ground_truths == (rubric_truth(f"question {r.prompt_id.split(':')[-1].split('@')[0]}", "Is correct."),)
        for _, r in run.engines.submitted
    )
