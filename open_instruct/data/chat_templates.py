"""Chat templates selectable with `--chat_template_name`.

Every name open-instruct's `CHAT_TEMPLATES` knows is accepted, and each renders byte for byte
the text open-instruct's template renders (tests/fixtures/chat_template_renderings.json holds
open-instruct's renderings), so prompts, and hence checkpoints and evals, carry over unchanged.
The Jinja is our own: each template is composed from the few building blocks below.

`tulu_thinker` opens a `<think>` block in the generation prompt, so responses start inside the
think block and end with `</think><answer>...</answer>`; verifiers rely on that layout. The
special name `tokenizer` keeps whatever template the tokenizer ships with.

None of open-instruct's templates renders the `tools` argument of `apply_chat_template`; only the
OLMo ones render tool schemas, from a message's `functions` key, so neither do ours.
"""

from __future__ import annotations

import json

from open_instruct.config.fields import ConfigError

# ----------------------------------------------------------------------------- building blocks
#
# Only `{{ }}` and `{% %}` tags, no raw text: transformers renders with trim_blocks and
# lstrip_blocks, which would silently eat a newline written right after a tag.


def _lit(text: str) -> str:
    """`text` as a Jinja string literal (JSON escapes are ones Jinja's literals decode)."""
    return json.dumps(text)


def _emit(text: str) -> str:
    return "{{ " + _lit(text) + " }}"


def _by_role(turns: dict[str, str]) -> str:
    """One branch per role; messages of other roles render nothing."""
    branches = [
        ("{% if" if i == 0 else "{% elif") + f" message['role'] == {_lit(role)} %}}" + body
        for i, (role, body) in enumerate(turns.items())
    ]
    return "".join(branches) + "{% endif %}"


def _conversation(
    turn: str,
    *,
    preamble: str = "",
    setup: str = "",
    separator: str = "",
    eos_after_last: bool = False,
    generation_prompt: str = "",
) -> str:
    """The loop all templates share.

    open-instruct writes the generation prompt inside the loop, after the last message, so an empty
    conversation gets none; `eos_after_last` closes a conversation that is not awaiting a reply.
    """
    parts = [setup, _emit(preamble) if preamble else "", "{% for message in messages %}"]
    if separator:
        parts.append("{% if not loop.first %}" + _emit(separator) + "{% endif %}")
    parts.append(turn)
    if eos_after_last:
        parts.append("{% if loop.last and not add_generation_prompt %}{{ eos_token }}{% endif %}")
    if generation_prompt:
        parts.append("{% if loop.last and add_generation_prompt %}" + _emit(generation_prompt) + "{% endif %}")
    parts.append("{% endfor %}")
    return "".join(parts)


_CONTENT = "message['content']"
_ROLE_PREFIX = "message['role'] | capitalize + ': '"

# ----------------------------------------------------------------------------- plain text
#
# The whole conversation as text, no role markers: for base models.

_FLAT_TEMPLATES = {
    "simple_concat_with_space": _conversation("{{ " + _CONTENT + " }}", separator=" ", eos_after_last=True),
    "simple_concat_with_new_line": _conversation("{{ " + _CONTENT + " }}", separator="\n", eos_after_last=True),
    "simple_chat": _conversation(
        "{{ " + _ROLE_PREFIX + " + " + _CONTENT + " }}", separator="\n\n", eos_after_last=True
    ),
    "assistant_message_only": _conversation(_by_role({"assistant": "{{ " + _CONTENT + " }}"})),
}

# ----------------------------------------------------------------------------- R1 / RL-zero prompts
#
# An instruction preamble, then `Role: content` turns; no EOS anywhere, since these only
# render prompts for RL from a base model.

_R1_INSTRUCTION = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
    "The assistant first thinks about the reasoning process in the mind and then provides the user with "
    "the answer. The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> "
    "tags, respectively, i.e., <think> reasoning process here </think> <answer> answer here </answer>.\n\n"
)

_R1_CODE_TOOL_INSTRUCTION = (
    "A conversation between User and Assistant. The User asks a question, and the Assistant solves it. "
    "The Assistant first thinks about the reasoning process in the mind and then provides the User with "
    "the answer. \n\n"
    "When given a question, the Assistant must conduct reasoning inside the <think> and </think> tags. "
    "During reasoning, the Assistant may write and execute python code using the <code> </code> tag, in "
    "order to solve the problem or verify the answer. Then the Assistant will get the stdout and stderr in "
    "the <output> and </output> tags. For example, the code could be\n"
    "<code>\nx, y = 1, 2\nresult = x + y\nprint(result)\n</code>\n"
    "or\n"
    "<code>\nimport sympy as sp\nfrom sympy import Symbol\nx = Symbol('x')\ny = Symbol('y')\n"
    "solution = sp.solve(x**2 + y**2 - 1, (x, y))\nprint(solution)\n</code>\n"
    "The Assistant will always `print` the result of the code execution in order to see it in the <output> "
    "tag. The Assistant may use the <code> </code> tag multiple times. When the Assistant is done reasoning, "
    "it should provide the answer inside the <answer> and </answer> tag.\n\n"
)

# open-instruct puts this in front of every turn, whatever its role.
_ANSWER_TAGS_ORDER = (
    "You must put your answer inside <answer> </answer> tags, i.e., <answer> answer here </answer>. "
    "And your final answer will be extracted automatically by the \\boxed{} tag. This is the problem: "
)


def _r1(preamble: str, generation_prompt: str, content_prefix: str = "") -> str:
    prefix = f" + {_lit(content_prefix)}" if content_prefix else ""
    turn = "{{ " + _ROLE_PREFIX + prefix + f" + {_CONTENT} + '\\n' }}}}"
    return _conversation(turn, preamble=preamble, separator="\n\n", generation_prompt=generation_prompt)


def _rlzero(preamble: str, generation_prompt: str) -> str:
    return _conversation(
        "{{ " + _CONTENT + " + '\\n' }}", preamble=preamble, separator="\n\n", generation_prompt=generation_prompt
    )


_R1_TEMPLATES = {
    "r1_simple_chat": _r1(_R1_INSTRUCTION, "Assistant:"),
    "r1_simple_chat_postpend_think": _r1(_R1_INSTRUCTION, "Assistant: <think>"),
    "r1_simple_chat_postpend_think_orz_style": _r1(_R1_INSTRUCTION, "Assistant: <think>", _ANSWER_TAGS_ORDER),
    "r1_simple_chat_postpend_think_tool_vllm": _r1(_R1_CODE_TOOL_INSTRUCTION, "Assistant: <think>", _ANSWER_TAGS_ORDER),
    "olmo_thinker_rlzero": _rlzero(
        "Solve the following problem step by step. The last line of your response should be the answer to the "
        "problem in form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n",
        '\nRemember to put your answer on its own line after "Answer:"',
    ),
    # open-instruct writes this reminder as raw text starting with "\n" right after a `{% if %}`
    # tag, where trim_blocks drops that newline; the rendered reminder therefore has none.
    "olmo_thinker_code_rlzero": _rlzero(
        "Solve the following code problem step by step. The last part of your response should be the solution "
        "to the problem in form ```\npython\nCODE\n``` where CODE is the solution for the problem.\n\n",
        "Remember to put your solution inside the ```\npython\nCODE\n``` tags",
    ),
}

# ----------------------------------------------------------------------------- Tulu / Zephyr


def _tulu(generation_prompt: str, *, preamble: str = "", drop_reasoning: bool = False) -> str:
    # The last assistant turn ends at its EOS, no newline: that is the text SFT trained on.
    assistant = "{% set content = message['content'] %}"
    if drop_reasoning:
        assistant += "{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}"
    assistant += "{{ '<|assistant|>\\n' + content + eos_token }}{% if not loop.last %}{{ '\\n' }}{% endif %}"
    turn = _by_role(
        {
            "system": "{{ '<|system|>\\n' + message['content'] + '\\n' }}",
            "user": "{{ '<|user|>\\n' + message['content'] + '\\n' }}",
            "assistant": assistant,
        }
    )
    return _conversation(turn, preamble=preamble, generation_prompt=generation_prompt)


def _zephyr_turn(role: str) -> str:
    return "{{ " + _lit(f"<|{role}|>\n") + " + message['content'] + eos_token + '\\n' }}"


_TULU_TEMPLATES = {
    "zephyr": _conversation(
        _by_role({role: _zephyr_turn(role) for role in ("user", "system", "assistant")}),
        generation_prompt="<|assistant|>\n",
    ),
    "tulu": _tulu("<|assistant|>\n"),
    "tulu_thinker": _tulu("<|assistant|>\n<think>"),
    # Assistant turns keep only what follows their last `</think>`, the final turn included, so
    # rendered conversations carry answers only; the R1 instruction precedes the Tulu turns.
    "tulu_thinker_r1_style": _tulu("<|assistant|>\n<think>", preamble=_R1_INSTRUCTION, drop_reasoning=True),
}

# ----------------------------------------------------------------------------- OLMo (<|im_start|>)
#
# olmo-core's format. Tool schemas ride on a system or user message's `functions` string and calls on
# an assistant message's `function_calls` string; tool results come back as `environment` turns.

_NO_FUNCTIONS = " You do not currently have access to any functions. <functions></functions>"


def _if_functions(then: str, otherwise: str) -> str:
    return "{% if message.get('functions', none) is not none %}" + then + "{% else %}" + otherwise + "{% endif %}"


def _olmo(default_system: str, generation_prompt: str, *, drop_earlier_reasoning: bool = False) -> str:
    if drop_earlier_reasoning:
        # Only a turn with both tags loses its reasoning, and never the last one: that is the
        # response being trained on.
        content = (
            "{% set content = message.get('content', none) %}"
            "{% if content is not none %}{% set content = content | string %}"
            "{% if not loop.last and '</think>' in content and '<think>' in content %}"
            "{% set content = content.split('</think>')[-1].lstrip('\\n') %}{% endif %}"
            "{{ content }}{% endif %}"
        )
    else:
        content = "{% if message.get('content', none) is not none %}{{ message['content'] }}{% endif %}"
    calls = (
        "{% if message.get('function_calls', none) is not none %}"
        "{{ '<function_calls>' + message['function_calls'] + '</function_calls>' }}{% endif %}"
    )
    # The final turn ends with EOS instead of <|im_end|>: the model must learn to stop there.
    end = "{% if not loop.last %}{{ '<|im_end|>\\n' }}{% else %}{{ eos_token }}{% endif %}"
    assistant = "{{ '<|im_start|>assistant\\n' }}" + content + calls + end
    turn = _by_role(
        {
            "system": "{{ '<|im_start|>system\\n' + message['content'] }}"
            + _if_functions(
                "{{ ' <functions>' + message['functions'] + '</functions><|im_end|>\\n' }}",
                _emit(_NO_FUNCTIONS + "<|im_end|>\n"),
            ),
            "user": _if_functions(
                "{{ '<|im_start|>user\\n' + message['content'] + '\\n<functions>' + message['functions']"
                " + '</functions><|im_end|>\\n' }}",
                "{{ '<|im_start|>user\\n' + message['content'] + '<|im_end|>\\n' }}",
            ),
            "assistant": assistant,
            "environment": "{{ '<|im_start|>environment\\n' + message['content'] + '<|im_end|>\\n' }}",
        }
    )
    setup = (
        "{% if 'system' not in messages | map(attribute='role') | list %}"
        + _emit(f"<|im_start|>system\n{default_system}<|im_end|>\n")
        + "{% endif %}"
    )
    return _conversation(turn, setup=setup, generation_prompt="<|im_start|>assistant\n" + generation_prompt)


_OLMO_2_SYSTEM = (
    "You are OLMo, a helpful function-calling AI assistant built by Ai2. Your date cutoff is November 2024, "
    "and your model weights are available at https://huggingface.co/allenai." + _NO_FUNCTIONS
)
_OLMO_3_SYSTEM = (
    "You are Olmo, a helpful AI assistant built by Ai2. Your date cutoff is December 2024, "
    "and your model weights are available at https://huggingface.co/allenai."
)
_PLAIN_SYSTEM = "You are a helpful AI assistant."

_OLMO_TEMPLATES = {
    "olmo": _olmo(_OLMO_2_SYSTEM, ""),
    "olmo_old": _olmo(_OLMO_2_SYSTEM, ""),
    "olmo_thinker": _olmo(_PLAIN_SYSTEM, "<think>"),
    "olmo_thinker_no_think_7b": _olmo(_OLMO_3_SYSTEM, ""),
    "olmo_thinker_remove_intermediate_thinking": _olmo(_PLAIN_SYSTEM, "<think>", drop_earlier_reasoning=True),
    "olmo_thinker_no_think_sft_tokenization": _olmo(_PLAIN_SYSTEM, ""),
}

# ----------------------------------------------------------------------------- Qwen instruct

# System messages are dropped, as open-instruct does; every user turn asks for a boxed answer.
QWEN_INSTRUCT_USER_BOXED_MATH = _conversation(
    _by_role(
        {
            "user": "{{ '<|im_start|>user\\n' + message['content'] + "
            + _lit("\n\nPlease reason step by step, and put your final answer within \\boxed{}<|im_end|>\n")
            + " }}",
            "assistant": "{{ '<|im_start|>assistant\\n' + message['content'] + '<|im_end|>\\n' }}",
        }
    ),
    generation_prompt="<|im_start|>assistant\n",
)

TULU = _TULU_TEMPLATES["tulu"]
TULU_THINKER = _TULU_TEMPLATES["tulu_thinker"]
R1_SIMPLE_CHAT = _R1_TEMPLATES["r1_simple_chat"]

CHAT_TEMPLATES: dict[str, str] = {
    **_FLAT_TEMPLATES,
    **_TULU_TEMPLATES,
    **_OLMO_TEMPLATES,
    **_R1_TEMPLATES,
    "qwen_instruct_user_boxed_math": QWEN_INSTRUCT_USER_BOXED_MATH,
}

# Keep the tokenizer's own template (Qwen, Llama, OLMo instruct models ship one).
TOKENIZER_OWN_TEMPLATE = "tokenizer"

CHAT_TEMPLATE_NAMES = (*CHAT_TEMPLATES, TOKENIZER_OWN_TEMPLATE)


def resolve_chat_template(name: str | None, tokenizer_template: str | None, fallback_to_tokenizer: bool = False) -> str:
    """The Jinja source for `name`; raises ConfigError (a ValueError) naming the choices when unknown.

    `fallback_to_tokenizer`: an unknown name keeps the tokenizer's own template instead, which is what
    open-instruct's default tokenizer function (get_tokenizer_tulu_v2_2) does; its launch scripts rely on
    it (one passes `olmo123` to mean "the model's own"). The caller says so in a warning. No name (None) is
    the tokenizer's own template, open-instruct's default too."""
    own = name is None or name == TOKENIZER_OWN_TEMPLATE
    if own or (fallback_to_tokenizer and name not in CHAT_TEMPLATES and tokenizer_template):
        if not tokenizer_template:
            given = "no --chat_template_name was given" if name is None else f"--chat_template_name {name} was given"
            raise ConfigError(
                f"{given} but the tokenizer has no chat template of its own; pick one of {', '.join(CHAT_TEMPLATES)}"
            )
        return tokenizer_template
    try:
        return CHAT_TEMPLATES[name]
    except KeyError:
        raise ConfigError(
            f"unknown --chat_template_name {name!r}; choose one of {', '.join(CHAT_TEMPLATE_NAMES)}"
        ) from None
