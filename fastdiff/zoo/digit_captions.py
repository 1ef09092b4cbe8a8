"""Captions for digits-sd: what each digit image shows, in words, for training and for the benchmark prompts.

An image's caption names its digit in one of 8 phrasings, or in one of 3 that also name its strokes ("thin" /
"medium" / "thick": the image's third of all training images by ink). The benchmark prompts name only the
digit, so the samples are compared with all test images.

Example::

    from fastdiff.zoo.digit_captions import stroke_words, training_prompts
    prompts, allowed = training_prompts(y_train, stroke_words(x_train))
    [prompts[i] for i in allowed[0]]   # every caption of the first image
"""

from __future__ import annotations

import re

import numpy as np

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
# {word}: the digit's name, {n}: its numeral, {stroke}: its ink third. Every image gets every template with the same
# probability: were some prompts allowed only for some images of a digit, guidance would tilt the samples
# toward the images those prompts favour.
TEMPLATES = (
    "a handwritten {word}",
    "the digit {n}",
    "the number {word}",
    "{word}",
    "{n}",
    "a drawing of the number {n}",
    "a picture of a handwritten {word}",
    "digit {word}",
)
STROKE_TEMPLATES = (
    "number {word}, {stroke} strokes",
    "a {stroke} handwritten {n}",
    "the digit {word} in {stroke} ink",
)
BENCH_TEMPLATES = ("a handwritten {word}", "the digit {n}", "the number {word}", "digit {word}")
EXTRA_WORDS = "zero digit number numeral handwritten written hand thick thin medium strokes stroke ink"


def digit_of(prompt: str) -> int:
    """The digit a prompt names (a numeral or a word), for scoring; ValueError if it names none or several.

    Example::

        assert digit_of("number seven, thick strokes") == 7 and digit_of("the digit 3") == 3
    """
    words = re.findall(r"[a-z]+|\d", prompt.lower())
    found = {DIGIT_WORDS.index(w) if w in DIGIT_WORDS else int(w) for w in words if w in DIGIT_WORDS or w.isdigit()}
    if len(found) != 1:
        raise ValueError(f"prompt {prompt!r} must name exactly one digit (0-9 or zero..nine), found {sorted(found)}")
    return found.pop()


def caption(template: str, digit: int, stroke: str = "") -> str:
    return template.format(word=DIGIT_WORDS[digit], n=digit, stroke=stroke)


def stroke_words(images: np.ndarray) -> list[str]:
    """The image's third of all images by ink (summed intensity): "thin", "medium" or "thick"."""
    ink = images.reshape(len(images), -1).sum(1)
    low, high = np.quantile(ink, [1 / 3, 2 / 3])
    return ["thick" if v >= high else "thin" if v <= low else "medium" for v in ink]


def training_prompts(labels: np.ndarray, strokes: list[str]) -> tuple[list[str], np.ndarray]:
    """Every prompt an image may get, and for each image the ids of its prompts (as many for every image);
    id 0 is the empty prompt, which only prompt dropout gives."""
    table: dict[str, int] = {"": 0}
    allowed = []
    for digit, stroke in zip(np.asarray(labels).tolist(), strokes):
        names = [caption(t, digit) for t in TEMPLATES] + [caption(t, digit, stroke) for t in STROKE_TEMPLATES]
        allowed.append([table.setdefault(n, len(table)) for n in names])
    return list(table), np.array(allowed)


def bench_prompts() -> list[str]:
    """The prompts ``fastdiff bench`` cycles through on digits-sd: each digit in turn, four phrasings that say
    nothing of the strokes."""
    return [caption(t, d) for t in BENCH_TEMPLATES for d in range(10)]


__all__ = [
    "DIGIT_WORDS",
    "TEMPLATES",
    "STROKE_TEMPLATES",
    "BENCH_TEMPLATES",
    "EXTRA_WORDS",
    "digit_of",
    "caption",
    "stroke_words",
    "training_prompts",
    "bench_prompts",
]
