"""Our chat templates render exactly what open-instruct's templates of the same name render.

The fixture holds open-instruct's own renderings (see its `source`), made once with transformers'
`apply_chat_template`, the way both trainers render prompts.
"""

import json
from pathlib import Path

import pytest

from open_instruct.config.fields import ConfigError
from open_instruct.data.chat_templates import (
    CHAT_TEMPLATE_NAMES,
    CHAT_TEMPLATES,
    TOKENIZER_OWN_TEMPLATE,
    resolve_chat_template,
)

FIXTURE = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "chat_template_renderings.json").read_text())
PROMPT_MODES = {"generation_prompt": True, "no_generation_prompt": False}


@pytest.fixture(scope="module")
def tokenizer():
    from open_instruct.data.embedded_default import build_tokenizer

    tok = build_tokenizer()
    assert tok.eos_token == FIXTURE["eos_token"]
    return tok


def test_every_open_instruct_template_name_is_ours():
    assert set(FIXTURE["renderings"]) == set(CHAT_TEMPLATES)
    assert set(CHAT_TEMPLATE_NAMES) == {*CHAT_TEMPLATES, TOKENIZER_OWN_TEMPLATE}


@pytest.mark.parametrize("name", sorted(FIXTURE["renderings"]))
def test_renders_byte_identical_to_open_instruct(tokenizer, name):
    tokenizer.chat_template = resolve_chat_template(name, None)
    expected = FIXTURE["renderings"][name]
    assert set(expected) == set(FIXTURE["cases"])
    mismatches = []
    for case, spec in FIXTURE["cases"].items():
        for mode, add_generation_prompt in PROMPT_MODES.items():
            got = tokenizer.apply_chat_template(
                spec["messages"], tools=spec.get("tools"), add_generation_prompt=add_generation_prompt, tokenize=False
            )
            if got != expected[case][mode]:
                mismatches.append(f"{case}/{mode}:\n  want {expected[case][mode]!r}\n  got  {got!r}")
    assert not mismatches, "\n".join(mismatches)


def test_tokenizer_name_keeps_the_tokenizers_template():
    assert resolve_chat_template(TOKENIZER_OWN_TEMPLATE, "{{ messages }}") == "{{ messages }}"
    with pytest.raises(ConfigError, match="has no chat template"):
        resolve_chat_template(TOKENIZER_OWN_TEMPLATE, None)


def test_unknown_name_is_a_one_line_config_error_listing_the_choices():
    with pytest.raises(ConfigError) as err:
        resolve_chat_template("nosuch", "{{ messages }}")
    message = str(err.value)
    assert "\n" not in message and "--chat_template_name 'nosuch'" in message
    for name in CHAT_TEMPLATE_NAMES:
        assert name in message
