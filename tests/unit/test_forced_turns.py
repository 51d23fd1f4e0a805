"""The forced-turn engine's regexes (tests/helpers/forced_turns.py, a test double the agent and extension tests
run on a real engine): which answer each sample of a prompt is forced to write."""

from __future__ import annotations


def test_a_forced_answer_is_the_rows_label_for_one_sample_and_another_regex_for_the_next():
    import re

    from helpers.forced_turns import GROUND_TRUTH, forced_regex

    from open_instruct.messages import PromptRequest, SamplingSettings

    request = PromptRequest("p", (1,), ((r"\frac{1}{2}", "0.5"),), ("math",), SamplingSettings(max_tokens=8), 2, 0, 0)
    answers = (r"\\boxed\{" + GROUND_TRUTH + r"\}", r"\\boxed\{0\}")
    right, wrong, right_again = (forced_regex(answers, request, i) for i in range(3))
    assert re.fullmatch(right, r"\boxed{\frac{1}{2}}") and right_again == right  # the first label, escaped
    assert re.fullmatch(wrong, r"\boxed{0}")
    assert forced_regex("<tool_call>", request, 1) == "<tool_call>"  # one regex: every sample
