r"""Final answers of math word problems: find the number a response commits to, compare exactly.

`extract_answer(text)` tries, in order (the first form present wins, and within it the *last* one):

1. `\boxed{...}` / `\fbox{...}` (balanced braces): the last number inside it;
2. `#### x` (GSM8K's form): the first number after the last `####`;
3. `answer is x` / `answer: x`: the first number after the last such phrase;
4. otherwise the last number anywhere in the text.

Numbers: `1,234` (thousands commas), `-3`, `0.5`, `.5`, `3/4`, LaTeX `\frac{3}{4}` / `\dfrac`, with `$`,
`%` and units around them ignored (`$18.00` == `18`, `18 apples` == `18`). Values are exact
`Fraction`s, so `18.0 == 18` and `0.75 == 3/4`; a minus directly after a digit or a letter is an
operator (`5-3` has the numbers 5 and 3), not a sign.
"""

from __future__ import annotations

import re
from fractions import Fraction

_NUMBER = re.compile(
    r"(?P<sign>(?<![\w)\]])[-\u2212])?(?:\$\s?)?"
    r"(?P<int>(?<![\d.])(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+))?(?P<frac>(?<!\d\.)\.\d+)?"
    r"(?:\s?/\s?(?P<den>\d+))?"
)
_LATEX_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*(-?[\d.,]+)\s*\}\s*\{\s*([\d.,]+)\s*\}")
_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_HASHES = re.compile(r"####")
_ANSWER_IS = re.compile(r"answer\s*(?:is|:)", re.IGNORECASE)


def numbers(text: str) -> list[Fraction]:
    """Every number in `text`, in order (see the module docstring for the forms)."""
    text = _LATEX_FRAC.sub(r"\1/\2", text.replace("{,}", ",").replace("\\!", ""))
    found = []
    for m in _NUMBER.finditer(text):
        if m.group("int") is None and m.group("frac") is None:
            continue
        value = _to_fraction(m)
        if value is not None:
            found.append(value)
    return found


def _to_fraction(m: re.Match[str]) -> Fraction | None:
    whole = (m.group("int") or "0").replace(",", "")
    value = Fraction(whole + (m.group("frac") or ""))
    if m.group("den") is not None:
        if int(m.group("den")) == 0:
            return None
        value /= int(m.group("den"))
    return -value if m.group("sign") else value


def boxed_contents(text: str) -> list[str]:
    r"""The contents of every `\boxed{...}` in order (braces balanced; an unclosed box is skipped)."""
    out = []
    for m in _BOX.finditer(text):
        depth, start = 1, m.end()
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                out.append(text[start:i])
                break
    return out


def _first_after(pattern: re.Pattern[str], text: str) -> Fraction | None:
    marks = list(pattern.finditer(text))
    if not marks:
        return None
    found = numbers(text[marks[-1].end() :])
    return found[0] if found else None


def extract_answer(text: str) -> Fraction | None:
    """The number `text` gives as its final answer, or None when it holds no number."""
    for box in reversed(boxed_contents(text)):
        found = numbers(box)
        if found:
            return found[-1]
    for pattern in (_HASHES, _ANSWER_IS):
        value = _first_after(pattern, text)
        if value is not None:
            return value
    found = numbers(text)
    return found[-1] if found else None


def has_final_answer_form(text: str) -> bool:
    r"""True when the response marks its answer explicitly: a `\boxed{}` or a `####` with a number."""
    return any(numbers(b) for b in boxed_contents(text)) or _first_after(_HASHES, text) is not None


def canonical(value: Fraction) -> str:
    """A stable text form: `18`, `-2.5`, `1/3` (a decimal only when it terminates)."""
    if value.denominator == 1:
        return str(value.numerator)
    den = value.denominator
    for p in (2, 5):
        while den % p == 0:
            den //= p
    if den != 1:
        return f"{value.numerator}/{value.denominator}"
    digits = 0
    while (value * 10**digits).denominator != 1:
        digits += 1
    return f"{float(value):.{digits}f}" if digits <= 15 else f"{value.numerator}/{value.denominator}"
