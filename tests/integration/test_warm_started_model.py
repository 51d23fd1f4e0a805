"""The warm-started embedded model (built once per machine, then cached): it loads as a Qwen2 model and solves
a minority of the held-out problems, so RL has both signal and room."""

from __future__ import annotations

import json

from open_instruct.data import embedded_default as ed


def test_warm_started_model_loads_and_solves_a_minority():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = ed.ensure_embedded_model()
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert model.config.model_type == "qwen2" and model.config.head_dim == 64
    summary = json.loads((path / "warm_start.json").read_text())
    assert summary["probe_accuracy"] >= ed.WarmStartSpec().target_accuracy
    _, eval_rows = ed.arith_rows()
    accuracy = ed.greedy_accuracy(model, tokenizer, eval_rows)
    # Solves some problems (RL has signal) but far from all (RL has room).
    assert 0.1 <= accuracy <= 0.7, accuracy
