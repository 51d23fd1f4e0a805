"""Dataset loading: mixer weights and splits, local sources, row validation, filters, cache, templates.

Real files in tmp_path and the embedded byte-level tokenizer (one token per byte, so token
counts are predictable); the counting proxy is the only stand-in, used to prove cache hits
skip tokenization.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pytest

from open_instruct.config.data import EMBEDDED_DATASET_NAME, DataConfig
from open_instruct.config.model import ModelConfig
from open_instruct.data import dataset as data
from open_instruct.data.dataset import DatasetError, load_prompt_dataset
from open_instruct.data.embedded_default import build_tokenizer

SAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "rlvr_samples"


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


class CountingTokenizer:
    """Delegates to a real tokenizer and counts the calls that render or tokenize prompts."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = Counter()

    def apply_chat_template(self, *args, **kwargs):
        self.calls["apply_chat_template"] += 1
        return self.inner.apply_chat_template(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        self.calls["__call__"] += 1
        return self.inner(*args, **kwargs)

    def __len__(self):
        return len(self.inner)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def row(i: int, **overrides) -> dict:
    base = {
        "messages": [{"role": "user", "content": f"What is {i} + 1?"}],
        "ground_truth": str(i + 1),
        "dataset": "gsm8k",
    }
    return {**base, **overrides}


def write_jsonl(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def load(tmp_path, tokenizer, mix, which="train", remap=None, seed=1, model=None, **data_kwargs):
    data_kwargs.setdefault("dataset_local_cache_dir", str(tmp_path / "cache"))
    key = "dataset_mixer_list" if which == "train" else "dataset_mixer_eval_list"
    cfg = DataConfig(**{key: [str(x) for x in mix]}, **data_kwargs)
    return load_prompt_dataset(cfg, model or ModelConfig(), tokenizer, which, remap, seed=seed)


def prompt_text(tokenizer, prompt) -> str:
    return tokenizer.decode(prompt.prompt_token_ids)


# ----------------------------------------------------------------------------- mixer


def test_mixer_fraction_absolute_and_upsampled_counts(tmp_path, tok):
    path = write_jsonl(tmp_path / "ten.jsonl", [row(i) for i in range(10)])
    whole = load(tmp_path, tok, [path, "1.0"])
    assert [p.index for p in whole.prompts] == list(range(10))  # whole dataset keeps the original order
    assert len(load(tmp_path, tok, [path, "0.5"]).prompts) == 5
    assert len(load(tmp_path, tok, [path, "1"]).prompts) == 10  # "1" is the fraction 1.0, not one row
    three = load(tmp_path, tok, [path, "3"]).prompts
    assert len(three) == 3 and len({p.index for p in three}) == 3
    up = load(tmp_path, tok, [path, "25"])
    counts = Counter(p.index for p in up.prompts)
    assert (
        len(up.prompts) == 25 and sorted(set(counts.values())) == [2, 3] and sum(v == 3 for v in counts.values()) == 5
    )
    assert len({p.prompt_id for p in up.prompts}) == 25  # repeats get distinct, stable ids
    source = up.report.sources[0]
    assert (source.rows_read, source.rows_selected, source.prompts) == (10, 25, 25)
    assert "upsampled" in up.report.summary()
    with pytest.raises(DatasetError, match="whole number"):
        load(tmp_path, tok, [path, "2.5"])


def test_selection_is_deterministic_given_the_seed(tmp_path, tok):
    path = write_jsonl(tmp_path / "forty.jsonl", [row(i) for i in range(40)])
    first = [p.index for p in load(tmp_path, tok, [path, "0.5"], seed=3).prompts]
    again = [p.index for p in load(tmp_path, tok, [path, "0.5"], seed=3, dataset_local_cache_dir="").prompts]
    other = [p.index for p in load(tmp_path, tok, [path, "0.5"], seed=4).prompts]
    assert first == again and first == sorted(first) and len(first) == 20
    assert first != other


def test_splits_per_dataset_and_for_all(tmp_path, tok):
    folder = tmp_path / "ds"
    write_jsonl(folder / "train.jsonl", [row(i) for i in range(4)])
    write_jsonl(folder / "test.jsonl", [row(i) for i in range(100, 102)])
    both = load(tmp_path, tok, [folder, "1.0", folder, "1.0"], dataset_mixer_list_splits=["train", "test"])
    assert [s.split for s in both.report.sources] == ["train", "test"]
    assert Counter(p.source for p in both.prompts) == {f"{folder}:train": 4, f"{folder}:test": 2}
    assert both.prompts[-1].prompt_id == f"{folder}:test:1"
    other = tmp_path / "other"
    write_jsonl(other / "test.jsonl", [row(i) for i in range(2)])
    same = load(tmp_path, tok, [folder, "1.0", other, "0.5"], dataset_mixer_list_splits=["test"])
    assert [s.prompts for s in same.report.sources] == [2, 1]
    with pytest.raises(DatasetError, match=r"listed twice; give one entry with the combined weight"):
        load(tmp_path, tok, [folder, "1.0", folder, "1.0"])
    with pytest.raises(DatasetError, match="--dataset_mixer_list_splits has 3 values for 2 datasets"):
        load(
            tmp_path,
            tok,
            [folder, "1.0", folder, "1.0"],
            dataset_mixer_list_splits=["train", "test", "train"],
        )


def test_eval_mix_uses_its_own_list_and_splits(tmp_path, tok):
    folder = tmp_path / "ds"
    write_jsonl(folder / "train.jsonl", [row(i) for i in range(4)])
    write_jsonl(folder / "test.jsonl", [row(i) for i in range(3)])
    evaluation = load(tmp_path, tok, [folder, "1.0"], which="eval")  # default eval split: test
    assert len(evaluation) == 3 and evaluation.report.which == "eval"
    assert len(load(tmp_path, tok, [], which="eval")) == 0
    with pytest.raises(DatasetError, match="--dataset_mixer_eval_list_splits has 2 values"):
        load(tmp_path, tok, [folder, "1.0"], which="eval", dataset_mixer_eval_list_splits=["a", "b"])


# ----------------------------------------------------------------------------- sources


def test_local_jsonl_json_parquet_and_directory_sources_agree(tmp_path, tok):
    rows = [row(i) for i in range(5)]
    jsonl = write_jsonl(tmp_path / "a.jsonl", rows)
    as_list = tmp_path / "b.json"
    as_list.write_text(json.dumps(rows))
    lines_in_json = write_jsonl(tmp_path / "c.json", rows)  # JSON lines under a .json name
    parquet = write_parquet(tmp_path / "d.parquet", rows)
    hub_layout = tmp_path / "hub_copy"
    write_parquet(hub_layout / "data" / "train-00000-of-00002.parquet", rows[:3])
    write_parquet(hub_layout / "data" / "train-00001-of-00002.parquet", rows[3:])
    expected = [p.prompt_token_ids for p in load(tmp_path, tok, [jsonl, "1.0"]).prompts]
    for source in (as_list, lines_in_json, parquet, hub_layout):
        loaded = load(tmp_path, tok, [source, "1.0"]).prompts
        assert [p.prompt_token_ids for p in loaded] == expected, source
        assert [p.ground_truths for p in loaded] == [(str(i + 1),) for i in range(5)]
    with pytest.raises(
        DatasetError,
        match=r"hub_copy has no files for split 'test'; --dataset_mixer_list_splits asked for it .*"
        r"data/train-00000-of-00002\.parquet",
    ):
        load(tmp_path, tok, [hub_layout, "1.0"], dataset_mixer_list_splits=["test"])
    with pytest.raises(DatasetError, match=r"no files for split 'test'; --dataset_mixer_eval_list_splits asked"):
        load(tmp_path, tok, [hub_layout, "1.0"], which="eval")  # the eval mix's default split
    with pytest.raises(DatasetError, match="no such file or directory"):
        load(tmp_path, tok, [tmp_path / "missing.jsonl", "1.0"])


def test_rlvr_sample_files_load_and_ignore_extra_columns(tmp_path, tok):
    files = sorted(SAMPLES.glob("*.jsonl"))
    assert len(files) == 7
    mix = [x for f in files for x in (f, "1.0")]
    loaded = load(tmp_path, tok, mix, max_prompt_token_length=4096)
    assert [s.prompts for s in loaded.report.sources] == [s.rows_read for s in loaded.report.sources]
    by_file = {Path(p.source.rsplit(":", 1)[0]).name: p for p in loaded.prompts}
    code = by_file["acecoder.jsonl"]
    assert code.verifier_names == ("code",) and isinstance(code.ground_truths[0], list)  # asserts stay one label
    assert code.ground_truths[0][0].startswith("assert ")
    mixed = [p for p in loaded.prompts if "mixed" in p.source]
    assert ("MATH",) in [p.verifier_names for p in mixed]  # case-insensitive validation, name kept as written
    assert all("_note" not in prompt_text(tok, p) for p in loaded.prompts)


def test_orz_trailing_assistant_answer_is_dropped(tmp_path, tok):
    orz = load(tmp_path, tok, [SAMPLES / "orz_math.jsonl", "1.0"], max_prompt_token_length=4096).prompts
    rows = [json.loads(line) for line in (SAMPLES / "orz_math.jsonl").read_text().splitlines()]
    assert any(len(r["messages"]) == 2 and r["messages"][-1]["role"] == "assistant" for r in rows)
    for prompt, source_row in zip(orz, rows):
        user_only = [m for m in source_row["messages"] if m["role"] == "user"]
        expected = tok.apply_chat_template(user_only, add_generation_prompt=True, tokenize=True)
        assert list(prompt.prompt_token_ids) == list(expected["input_ids"] if hasattr(expected, "keys") else expected)
        assert prompt_text(tok, prompt).count("<|assistant|>") == 1


def test_embedded_dataset_loads_through_the_same_path(tmp_path, tok, monkeypatch):
    monkeypatch.setenv("OPEN_INSTRUCT_CACHE_DIR", str(tmp_path / "assets"))
    train = load(tmp_path, tok, [EMBEDDED_DATASET_NAME, "50"])
    assert len(train) == 50 and train.prompts[0].source == f"{EMBEDDED_DATASET_NAME}:train"
    assert train.prompts[0].verifier_names == ("gsm8k",)
    evaluation = load(tmp_path, tok, [EMBEDDED_DATASET_NAME, "1.0"], which="eval")  # split test -> eval.jsonl
    assert len(evaluation) == 64
    default = load_prompt_dataset(  # no mix at all: the embedded training set
        DataConfig(dataset_local_cache_dir=str(tmp_path / "cache")), ModelConfig(), tok, "train"
    )
    assert default.report.sources[0].name == EMBEDDED_DATASET_NAME and len(default) == 4000


# ----------------------------------------------------------------------------- cache


def test_cache_hit_skips_tokenization_and_any_change_misses(tmp_path, tok):
    path = write_jsonl(tmp_path / "six.jsonl", [row(i) for i in range(6)])
    counting = CountingTokenizer(tok)
    first = load(tmp_path, counting, [path, "1.0"])
    assert first.report.sources[0].cache == "miss" and counting.calls["apply_chat_template"] == 6
    counting.calls.clear()
    second = load(tmp_path, counting, [path, "1.0"])
    assert second.report.sources[0].cache == "hit" and "cache hit" in second.report.summary()
    assert counting.calls["apply_chat_template"] == 0 and counting.calls["__call__"] == 0
    assert second.prompts == first.prompts
    changes = [
        {"max_prompt_token_length": 200},
        {"dataset_skip_bad_rows": True},
        {"system_prompt_override": "Be brief."},
        {"model": ModelConfig(add_bos=False, chat_template_name="tulu")},  # the name alone is part of the key
        {"remap": {"gsm8k": "math"}},
        {"seed": 2, "mix": [path, "3"]},
    ]
    for change in changes:
        mix = change.pop("mix", [path, "1.0"])
        assert load(tmp_path, counting, mix, **change).report.sources[0].cache == "miss", change
    write_jsonl(path, [row(i) for i in range(6)] + [row(99)])  # the file changed
    assert load(tmp_path, counting, [path, "1.0"]).report.sources[0].cache == "miss"
    other_template = build_tokenizer()
    other_template.chat_template = other_template.chat_template.replace("<think>", "")
    assert load(tmp_path, other_template, [path, "1.0"]).report.sources[0].cache == "miss"
    assert load(tmp_path, tok, [path, "1.0"], dataset_local_cache_dir="").report.sources[0].cache == "off"


# ----------------------------------------------------------------------------- malformed rows

MALFORMED = [
    ({"ground_truth": "1", "dataset": "gsm8k"}, "missing key", "missing key 'messages'"),
    (
        {"messages": [{"role": "user", "content": "q"}], "dataset": "gsm8k"},
        "missing key",
        "missing key 'ground_truth'",
    ),
    (
        {"messages": [{"role": "user", "content": "q"}], "ground_truth": "1"},
        "missing key",
        "missing key 'dataset'",
    ),
    (row(0, messages="What is 1 + 1?"), "wrong type", "must be a list of {role, content} messages, got str"),
    (row(0, dataset=7), "wrong type", "must be a verifier name or a non-empty list of names, got 7"),
    (row(0, ground_truth=None), "wrong type", "'ground_truth' is null"),
    (row(0, messages=[]), "empty messages", "'messages' is an empty list"),
    (row(0, messages=[{"role": "user"}]), "bad message", "message 0 has no 'content'"),
    (row(0, messages=[{"content": "q"}]), "bad message", "message 0 has no 'role'"),
    (row(0, messages=["q"]), "bad message", "message 0 is a str"),
    (
        row(0, dataset="ace_coder"),
        "unknown verifier",
        "unknown verifier 'ace_coder' (known: code, code_stdio",
    ),
    (
        row(0, dataset=["math", "gsm8k"], ground_truth=["1"]),
        "label/verifier length mismatch",
        "lists 2 verifier(s)",
    ),
    (row(0, dataset=["math"], ground_truth="1"), "label/verifier length mismatch", "'ground_truth' is a str"),
    ("{not json", "unreadable row", "not valid JSON"),
    ("[1, 2]", "unreadable row", "the row is a JSON list"),
]


@pytest.mark.parametrize("bad, reason, problem", MALFORMED, ids=[f"{m[1]}:{m[2][:24]}" for m in MALFORMED])
def test_malformed_row_message_names_dataset_row_and_problem(tmp_path, tok, bad, reason, problem):
    path = write_jsonl(tmp_path / "bad.jsonl", [row(0), "", bad, row(2)])  # blank line: row 1 is on line 3
    with pytest.raises(DatasetError) as error:
        load(tmp_path, tok, [path, "1.0"])
    message = str(error.value)
    assert message.startswith(f"{path} [train] row 1 (bad.jsonl line 3): ")
    assert problem in message
    assert "--dataset_skip_bad_rows" in message


def test_unknown_verifier_suggests_a_remap_and_the_remap_fixes_it(tmp_path, tok):
    path = write_jsonl(tmp_path / "code.jsonl", [row(0, dataset="ace_coder", ground_truth=["assert f() == 1"])])
    with pytest.raises(DatasetError, match=r"row 0 .*use --remap_verifier ace_coder=code or --dataset_skip_bad_rows"):
        load(tmp_path, tok, [path, "1.0"])
    fixed = load(tmp_path, tok, [path, "1.0"], remap={"ACE_CODER": "code"})
    assert fixed.prompts[0].verifier_names == ("ace_coder",)  # the reward side applies the remap
    with pytest.raises(DatasetError, match="'nope' is not a known verifier"):
        load(tmp_path, tok, [path, "1.0"], remap={"ace_coder": "nope"})


def test_skip_mode_counts_every_skipped_row_per_reason(tmp_path, tok):
    bad_rows = [m[0] for m in MALFORMED]
    path = write_jsonl(tmp_path / "mixed.jsonl", [row(0), *bad_rows, row(1)])
    loaded = load(tmp_path, tok, [path, "1.0"], dataset_skip_bad_rows=True)
    source = loaded.report.sources[0]
    assert source.prompts == 2 and [p.index for p in loaded.prompts] == [0, len(bad_rows) + 1]
    assert source.malformed == dict(Counter(m[1] for m in MALFORMED))
    assert source.rows_selected == source.prompts + source.too_long + sum(source.malformed.values())
    summary = loaded.report.summary()
    assert f"skipped malformed {len(bad_rows)}" in summary and "unknown verifier 1" in summary
    assert f"{path} [train] row 11 (mixed.jsonl line 12): unknown verifier 'ace_coder'" in summary
    with pytest.raises(DatasetError, match="every selected row is malformed"):
        load(
            tmp_path,
            tok,
            [write_jsonl(tmp_path / "all_bad.jsonl", bad_rows), "1.0"],
            dataset_skip_bad_rows=True,
        )


def test_template_error_is_a_row_error(tmp_path, tok):
    strict = build_tokenizer()
    strict.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tool turns') }}{% endif %}"
        "{{ m['content'] }}{% endfor %}"
    )
    path = write_jsonl(tmp_path / "tool.jsonl", [row(0), row(1, messages=[{"role": "tool", "content": "x"}])])
    with pytest.raises(DatasetError, match=r"row 1: the chat template failed .*no tool turns"):
        load(tmp_path, strict, [path, "1.0"])
    skipped = load(tmp_path, strict, [path, "1.0"], dataset_skip_bad_rows=True)
    assert skipped.report.sources[0].malformed == {"chat template error": 1} and len(skipped) == 1


# ----------------------------------------------------------------------------- length filter


def test_length_filter_counts_dropped_prompts_and_fails_when_nothing_is_left(tmp_path, tok):
    rows = [row(0), row(1, messages=[{"role": "user", "content": "x" * 300}]), row(2)]
    path = write_jsonl(tmp_path / "long.jsonl", rows)
    loaded = load(tmp_path, tok, [path, "1.0"], max_prompt_token_length=64)
    source = loaded.report.sources[0]
    assert [p.index for p in loaded.prompts] == [0, 2] and source.too_long == 1
    assert all(len(p.prompt_token_ids) <= 64 for p in loaded.prompts) and source.longest_prompt <= 64
    assert "too long 1" in loaded.report.summary()
    with pytest.raises(
        DatasetError, match=r"all 3 usable selected prompts are longer than --max_prompt_token_length 5"
    ):
        load(tmp_path, tok, [path, "1.0"], max_prompt_token_length=5)


# ----------------------------------------------------------------------------- templates


def test_system_prompt_override_replaces_or_inserts(tmp_path, tok):
    with_system = row(0, messages=[{"role": "system", "content": "OLD"}, {"role": "user", "content": "Q?"}])
    path = write_jsonl(tmp_path / "sys.jsonl", [with_system, row(1)])
    loaded = load(tmp_path, tok, [path, "1.0"], system_prompt_override="Think first.")
    replaced, inserted = (prompt_text(tok, p) for p in loaded.prompts)
    assert replaced == "<|system|>\nThink first.\n<|user|>\nQ?\n<|assistant|>\n<think>"
    assert inserted.startswith("<|system|>\nThink first.\n<|user|>\nWhat is 1 + 1?") and "OLD" not in replaced


def test_add_bos_prepends_once_and_requires_a_bos_token(tmp_path, tok):
    path = write_jsonl(tmp_path / "bos.jsonl", [row(0)])
    with pytest.raises(DatasetError, match="no BOS token"):
        load(tmp_path, tok, [path, "1.0"], model=ModelConfig(add_bos=True))
    with_bos = build_tokenizer()
    with_bos.add_special_tokens({"bos_token": "<|bos|>"})
    bos = with_bos.bos_token_id
    plain = load(tmp_path, with_bos, [path, "1.0"]).prompts[0].prompt_token_ids
    added = load(tmp_path, with_bos, [path, "1.0"], model=ModelConfig(add_bos=True)).prompts[0].prompt_token_ids
    assert plain[0] != bos and added == (bos, *plain)
    with_bos.chat_template = "{{ bos_token }}" + with_bos.chat_template  # the template already emits BOS
    templated = load(tmp_path, with_bos, [path, "1.0"], model=ModelConfig(add_bos=True)).prompts[0].prompt_token_ids
    assert templated == added


def test_list_typed_dataset_and_ground_truth_rows(tmp_path, tok):
    multi = row(0, dataset=["math", "string_f1"], ground_truth=["2", "two"])
    code = row(1, dataset=["code"], ground_truth=[["assert f() == 1", "assert f() != 2"]])
    plain = row(2)
    # One JSONL file may mix str- and list-typed rows (Arrow's JSON reader would reject it).
    first, second, third = load(
        tmp_path, tok, [write_jsonl(tmp_path / "lists.jsonl", [multi, code, plain]), "1.0"]
    ).prompts
    assert first.verifier_names == ("math", "string_f1") and first.ground_truths == ("2", "two")
    assert second.verifier_names == ("code",) and second.ground_truths == (["assert f() == 1", "assert f() != 2"],)
    assert third.verifier_names == ("gsm8k",) and third.ground_truths == ("3",)
    from_parquet = load(tmp_path, tok, [write_parquet(tmp_path / "lists.parquet", [multi]), "1.0"]).prompts
    assert (
        from_parquet[0].ground_truths == first.ground_truths and from_parquet[0].verifier_names == first.verifier_names
    )


def test_hub_path_runs_the_same_row_processing(tmp_path, tok, monkeypatch):
    """`datasets.load_dataset(name, split=...)` on a local folder stands in for a hub repo (no network here)."""
    import datasets

    from open_instruct.data import sources as data_sources

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    folder = tmp_path / "fake_hub_repo"
    write_jsonl(folder / "train.jsonl", [{**row(i), "output": ["huge"] * 3} for i in range(4)])
    monkeypatch.setattr(data, "open_source", lambda name, split, flag: data_sources.HubSource(name, split, flag))
    via_hub = load(tmp_path, tok, [folder, "0.5"])
    assert via_hub.report.sources[0].rows_read == 4 and len(via_hub) == 2
    monkeypatch.undo()
    direct = load(tmp_path, tok, [folder, "0.5"])
    assert [(p.index, p.prompt_token_ids, p.ground_truths) for p in via_hub.prompts] == [
        (p.index, p.prompt_token_ids, p.ground_truths) for p in direct.prompts
    ]

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    # This machine cannot reach the Hub: one request with a timeout says so, before `datasets` retries.
    started = time.monotonic()
    with pytest.raises(
        DatasetError, match=r"no/such-repo: the Hugging Face Hub did not answer within 5 s .*HF_HUB_OFFLINE"
    ):
        load(tmp_path, tok, ["no/such-repo", "1.0"])
    assert time.monotonic() - started < 10
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # offline on purpose: straight to `datasets` and its cache
    with pytest.raises(DatasetError, match=r"no/such-repo \[train\]: could not load it from the HF hub .*no network"):
        load(tmp_path, tok, ["no/such-repo", "1.0"])


def test_a_hub_dataset_without_the_split_asked_for_names_the_split_and_the_flag(tmp_path, tok, monkeypatch):
    """Through `datasets.load_dataset` on a hub name (a local builder cached it, as a download would): the
    dataset has only `train`; the name is right, so the line blames the split and the flag that chose it."""
    from helpers.hub_datasets import cache_hub_dataset, offline_hub

    hub = tmp_path / "hub"
    cache_hub_dataset(hub, "owner/train-only", {"train": [row(i) for i in range(4)]})
    offline_hub(monkeypatch, hub)
    assert len(load(tmp_path, tok, ["owner/train-only", "1.0"])) == 4
    assert len(load(tmp_path, tok, ["owner/train-only", "1.0"], which="eval", dataset_mixer_eval_list_splits=["train"]))
    line = r"owner/train-only has no split 'test' \(its splits: train\); {} asked for it: name one it has$"
    with pytest.raises(DatasetError, match=line.format("--dataset_mixer_eval_list_splits")):
        load(tmp_path, tok, ["owner/train-only", "1.0"], which="eval")  # the eval mix's default split
    with pytest.raises(DatasetError, match=line.format("--dataset_mixer_list_splits")):
        load(tmp_path, tok, ["owner/train-only", "1.0"], dataset_mixer_list_splits=["test"])
    with pytest.raises(DatasetError, match=r"embedded/arith has no split 'dev' \(its splits: train, test, eval"):
        load(tmp_path, tok, [EMBEDDED_DATASET_NAME, "1.0"], dataset_mixer_list_splits=["dev"])
