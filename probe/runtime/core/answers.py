"""The blank answers the probe makes up (see the glossary in ``contract``): typed, so that no
cache and no reader mistakes them for a model's."""

from __future__ import annotations


class BlankAnswer(str):
    """The empty answer the probe makes up; its type keeps it out of every cache."""

    __slots__ = ()


BLANK = BlankAnswer("")


def blanks(n: int) -> list[str]:
    """``n`` blank answers."""
    return [BLANK] * n


class BlankResponse(dict):
    """What the sync path's ``model_call`` returns for a short-circuited request.

    Shaped like a real response, so a parser that is not ours still reads empty answers;
    ours recognises the type and answers with :data:`BLANK` instead.
    """

    def __init__(self, n: int) -> None:
        choice = {"text": "", "message": {"content": ""}, "finish_reason": "lm_eval_probe"}
        super().__init__(choices=[{"index": i, **choice} for i in range(n)])
        self.n = n
