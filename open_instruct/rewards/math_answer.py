"""`math` and `strict_math` verifiers: does the response's final answer equal the gold LaTeX answer?

Extraction (`math`): the last brace-balanced `\\boxed{...}`, the Minerva sentence
"Final Answer: The final answer is X. I hope it is correct." and the last `<answer>...</answer>`
span are all candidates; if none exists, the text between the last two `$`; if still nothing, the
whole output (compared as a string only). `strict_math` uses the Minerva sentence only, else the
whole output.

Equivalence: a candidate matches when either
- math-verify (sympy-backed) says so, or
- the Hendrycks MATH string normalisation (`strip_string` style) makes both sides identical.

open-instruct's sympy check arms SIGALRM, which raises outside the main thread, so during its
training only the string fallback works. math-verify has the same problem with its default
timeouts; we call it with `parsing_timeout=None` / `timeout_seconds=None` so it never touches
signals and works in any thread or process. Time limits are the reward pool's job
(`open_instruct.rewards.scoring` runs verifiers in killable worker processes). As a result our
rewards are more lenient (and more correct) than open-instruct's in practice: `0.50` matches
`\\frac{1}{2}`, `2\\sqrt{2}` matches `\\sqrt{8}`, and so on.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from math_verify import parse, verify

from open_instruct.extensions import register_verifier
from open_instruct.rewards import RewardSettings, VerifierInput, VerifierResult


class _DropDisabledTimeoutWarning(logging.Filter):
    # math-verify warns once per process that its timeout is off; that is deliberate here.
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropDisabledTimeoutWarning())

_MINERVA = re.compile(r"Final Answer: The final answer is (.*?)\. I hope it is correct\.", re.DOTALL)
_ANSWER_SPAN = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


# ---------------------------------------------------------------------------------------------
# Extraction


def _braced_group(text: str, start: int) -> tuple[str, int] | None:
    """Content of the `{...}` group opening at `text[start]` and the index after it; escaped braces
    (`\\{`, `\\}`) do not count. None when the group is never closed (e.g. a truncated response)."""
    depth = 0
    i = start
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
        i += 1
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last complete `\\boxed{...}` (nested braces allowed) or `\\boxed X` form."""
    pos = len(text)
    while (pos := text.rfind("\\boxed", 0, pos)) != -1:
        after = pos + len("\\boxed")
        if text.startswith("{", after):
            group = _braced_group(text, after)
            if group is not None:
                return group[0]
        elif text.startswith(" ", after):
            # `\boxed 5`: one token; stop at `$` or a tag so `</answer>` does not stick to it.
            token = re.match(r"\s*([^\s$<]+)", text[after:])
            if token:
                return token.group(1)
    return None


def minerva_answer(text: str) -> str | None:
    matches = _MINERVA.findall(text)
    return matches[-1] if matches else None


def last_dollar_span(text: str) -> str | None:
    parts = text.rsplit("$", 2)
    return parts[1] if len(parts) == 3 else None


_UNIT_WORDS = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "inch",
    "ft",
    "hours",
    "km",
    "units",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "students",
    "multiples",
)
_UNIT_RE = re.compile(r"\b(?:" + "|".join(_UNIT_WORDS) + r")\b")


def normalize_final_answer(answer: str) -> str:
    """Minerva-style clean-up for free-text candidates (sentence, answer tag, `$` span)."""
    answer = answer.split("=")[-1]
    for before, after in (("\\$", ""), ("\\ ", ""), ("mbox", "text"), ("\\text{and}", ","), ("\\dots", "")):
        answer = answer.replace(before, after)
    answer = _UNIT_RE.sub("", answer)
    dollar = re.search(r"\$(.*?)\$", answer, re.DOTALL)
    if dollar:
        answer = dollar.group(1)
    for macro in ("text", "textbf", "overline", "mathrm"):
        answer = re.sub(r"\\" + macro + r"\{(.*?)\}", r"\1", answer)
    boxed = last_boxed(answer)
    if boxed is not None:
        answer = boxed
    answer = answer.replace("$", "").strip().rstrip(".").strip()
    if re.fullmatch(r"\d{1,3}(,\d{3})+", answer):
        answer = answer.replace(",", "")
    return answer


def candidates(prediction: str, strict: bool) -> tuple[list[str], bool]:
    """The answers to compare, and whether they came from an explicit answer marker."""
    minerva = minerva_answer(prediction)
    if strict:
        if minerva is not None:
            return [normalize_final_answer(minerva)], True
        return [prediction], False
    found: list[str] = []
    boxed = last_boxed(prediction)
    if boxed is not None:
        found.append(boxed)
    if minerva is not None:
        found.append(normalize_final_answer(minerva))
    spans = _ANSWER_SPAN.findall(prediction)
    if spans:
        found.append(normalize_final_answer(spans[-1]))
    if not found:
        dollar = last_dollar_span(prediction)
        if dollar is not None:
            found.append(normalize_final_answer(dollar))
    if found:
        return [c for c in found if c.strip()], True
    return [prediction], False


# ---------------------------------------------------------------------------------------------
# Hendrycks MATH string normalisation (written from its documented behaviour)


def _fix_fracs(s: str) -> str:
    """`\\frac12` -> `\\frac{1}{2}`, `\\frac1{2}` -> `\\frac{1}{2}`; braced arguments are kept."""
    out: list[str] = []
    i = 0
    while (j := s.find("\\frac", i)) != -1:
        out.append(s[i : j + len("\\frac")])
        k = j + len("\\frac")
        for _ in range(2):
            if k >= len(s):
                break
            if s[k] == "{":
                group = _braced_group(s, k)
                if group is None:
                    break
                out.append("{" + group[0] + "}")
                k = group[1]
            elif s[k] == "\\":
                break
            else:
                out.append("{" + s[k] + "}")
                k += 1
        i = k
    out.append(s[i:])
    return "".join(out)


def strip_string(s: str) -> str:
    s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "")
    s = re.sub(r"\\(?:text|mbox)\{\s[^{}]*\}\s*$", "", s)  # trailing "\text{ cm}" unit
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if s.startswith("."):
        s = "0" + s
    lhs, eq, rhs = s.partition("=")
    if eq and "=" not in rhs and len(lhs.strip()) <= 2:
        s = rhs
    s = re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)
    s = s.replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    ratio = re.fullmatch(r"(-?\d+)/(\d+)", s)
    if ratio:
        s = f"\\frac{{{ratio.group(1)}}}{{{ratio.group(2)}}}"
    return s


def hendrycks_equiv(candidate: str, gold: str) -> bool:
    return bool(gold.strip()) and strip_string(candidate) == strip_string(gold)


# ---------------------------------------------------------------------------------------------
# Verifiers


def _parse(latex: str) -> list[Any]:
    latex = latex.strip().strip("$")
    if not latex:
        return []
    return parse(f"${latex}$", parsing_timeout=None)


def _golds(ground_truth: Any) -> list[str]:
    if isinstance(ground_truth, (list, tuple)):
        return [str(g) for g in ground_truth if g is not None and str(g).strip()]
    if ground_truth is None or not str(ground_truth).strip():
        return []
    return [str(ground_truth)]


def _score(inp: VerifierInput, strict: bool) -> VerifierResult:
    golds = _golds(inp.ground_truth)
    cands, explicit = candidates(inp.prediction, strict)
    if not golds or not cands:
        return VerifierResult(score=0.0, extracted=cands[0] if cands else None)
    for gold in golds:
        parsed_gold = _parse(gold) if explicit else []
        for cand in cands:
            if hendrycks_equiv(cand, gold):
                return VerifierResult(score=1.0, extracted=cand, details={"by": "string"})
            # The whole-output fallback is a string comparison only: letting sympy fish a number
            # out of free text would reward answers the model never committed to.
            if parsed_gold and explicit and verify(parsed_gold, _parse(cand), timeout_seconds=None):
                return VerifierResult(score=1.0, extracted=cand, details={"by": "math_verify"})
    return VerifierResult(score=0.0, extracted=cands[-1])


@register_verifier("math")
def math_verifier(inp: VerifierInput, settings: RewardSettings) -> VerifierResult:
    return _score(inp, strict=False)


@register_verifier("strict_math")
def strict_math_verifier(inp: VerifierInput, settings: RewardSettings) -> VerifierResult:
    return _score(inp, strict=True)
