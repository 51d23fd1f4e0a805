"""Chat templates selectable with `--chat_template_name`.

The names follow open-instruct so launch scripts carry over. `tulu_thinker` opens a `<think>`
block in the generation prompt, so responses start inside the think block and end with
`</think><answer>...</answer>`; verifiers rely on that layout. The special name `tokenizer`
keeps whatever template the tokenizer ships with.
"""

from __future__ import annotations

from open_instruct.config_fields import ConfigError

_TULU_BODY = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ '<|system|>\n' + message['content'] + '\n' }}"
    "{% elif message['role'] == 'user' %}{{ '<|user|>\n' + message['content'] + '\n' }}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ '<|assistant|>\n' + message['content'] + eos_token + '\n' }}"
    "{% endif %}"
    "{% endfor %}"
)

TULU = _TULU_BODY + "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"

TULU_THINKER = _TULU_BODY + "{% if add_generation_prompt %}{{ '<|assistant|>\n<think>' }}{% endif %}"

_R1_INSTRUCTION = (
    "A conversation between User and Assistant. The User asks a question and the Assistant "
    "solves it. The Assistant first reasons step by step inside <think> </think> tags and then "
    "gives the final answer inside <answer> </answer> tags."
)

R1_SIMPLE_CHAT = (
    "{{ '" + _R1_INSTRUCTION + "\n\n' }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ 'User: ' + message['content'] + '\n' }}"
    "{% elif message['role'] == 'assistant' %}{{ 'Assistant: ' + message['content'] + eos_token + '\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant: <think>' }}{% endif %}"
)

CHAT_TEMPLATES: dict[str, str] = {
    "tulu": TULU,
    "tulu_thinker": TULU_THINKER,
    "r1_simple_chat": R1_SIMPLE_CHAT,
}

# Keep the tokenizer's own template (Qwen, Llama, OLMo instruct models ship one).
TOKENIZER_OWN_TEMPLATE = "tokenizer"

CHAT_TEMPLATE_NAMES = (*CHAT_TEMPLATES, TOKENIZER_OWN_TEMPLATE)


def resolve_chat_template(name: str, tokenizer_template: str | None) -> str:
    """The Jinja source for `name`; raises ValueError naming the choices when unknown."""
    if name == TOKENIZER_OWN_TEMPLATE:
        if not tokenizer_template:
            raise ValueError(
                "--chat_template_name tokenizer was given but the tokenizer has no chat template; "
                f"pick one of {', '.join(CHAT_TEMPLATES)}"
            )
        return tokenizer_template
    try:
        return CHAT_TEMPLATES[name]
    except KeyError:
        raise ConfigError(
            f"unknown --chat_template_name {name!r}; choose one of {', '.join(CHAT_TEMPLATE_NAMES)}"
        ) from None
