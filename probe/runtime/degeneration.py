"""A per-generation loop detector fed the output as it arrives (pure, standard library only).

The idea is the n-gram repetition CUSUM of the published detectors (the n-gram detector in
the vLLM PR #52677 comparison; vLLM's own ``repetition_detection`` and llama.cpp's detect
exact periods only): a generation that loops, exactly or not, keeps producing n-grams it
produced a little earlier. Each new unit closes one n-gram of ``ngram`` units; it scores 1
when that n-gram already occurred within the last ``window`` units, else 0. A one-sided
CUSUM, ``S = max(0, S + score - drift)``, accumulates the excess of repeats over ``drift``
and the generation is flagged once ``S >= threshold``. Healthy text repeats an n-gram now
and then (a refrain, a formula, a table's frame), which drains again at ``drift`` per unit;
a loop repeats nearly every n-gram, so S climbs by about ``1 - drift`` per unit.

One addition, for near-loops: a perturbed unit keeps the ``ngram`` n-grams around it from
recurring, so a loop with 5% of its units replaced would score only 0.95**10 = 60% of its
units. So the detector also locks on the distance of the last n-gram that recurred (the
loop's period) and scores 1 for a unit equal to the unit that far back: a perturbation then
costs about two units, not ``ngram``.

Guarantees (tested as properties):

- **Exact cycles.** Once a generation repeats a cycle of period P <= ``window`` units, it is
  flagged at most ``P + ngram - 1 + ceil(threshold / (1 - drift))`` units after the loop's
  first unit (:meth:`LoopDetector.flag_bound`): from then on every n-gram recurs P units back.
- **Near-loops.** A cycle with a share q of its units replaced at random scores about
  ``1 - 2q`` per unit (the period lock above), so it is flagged as long as that stays above
  ``drift``: at the default drift 0.6, up to q of about 20% (measured in
  ``benchmarks/bench_detector.py``: a 5% near-loop of 80 words within 200 units).
- **The split does not matter.** The verdict and the unit at which it comes depend only on
  the text fed so far, never on how it was cut into deltas (units are made incrementally,
  holding back only an unfinished word piece).
- **Flagged stays flagged**; after the flag, a delta costs nothing and the state is dropped.
- **Bounded cost.** Each delta costs O(len(delta)) and memory is O(window): no re-scan.

Units are a cheap token proxy: a run of word characters (letters, digits), or of other
characters that are not white space (punctuation), cut into pieces of at most
``UNIT_CHARS`` characters; white space only separates. A rule of dashes or equal signs is
then a few units, not dozens (BPE tokenizers merge such runs too). Healthy English and
technical text averages 3.5 characters a unit (the benchmark), about one BPE token; a
character-level tokenizer makes up to ``UNIT_CHARS`` tokens a unit.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import deque

UNIT_CHARS = 4
_UNITS = re.compile(r"\w+|[^\w\s]+")


class LoopDetector:
    """The loop detector of one generation: :meth:`feed` it the new text, in order."""

    def __init__(self, ngram: int, window: int, drift: float, threshold: float) -> None:
        if ngram < 1 or window < 1 or not 0.0 < drift < 1.0 or threshold <= 0.0:
            raise ValueError(f"bad loop detector settings: {ngram=}, {window=}, {drift=}, {threshold=}")
        self.ngram, self.window, self.drift, self.threshold = ngram, window, drift, threshold
        self.units = 0  # units completed so far
        self.flagged_at: int | None = None  # the unit count at which it flagged
        self.score = 0.0
        self._pending = ""  # an unfinished word piece (shorter than UNIT_CHARS)
        # The last units: enough for an n-gram, and for a copy ``window`` units back.
        self._history: deque[str] = deque(maxlen=max(ngram, window + 1))
        self._period: int | None = None  # the distance of the last n-gram that recurred
        self._last_seen: dict[tuple[str, ...], int] = {}  # n-gram -> the unit count it last ended at
        self._order: deque[tuple[int, tuple[str, ...]]] = deque()  # (end, n-gram), to forget old ones

    @property
    def flagged(self) -> bool:
        return self.flagged_at is not None

    def flag_bound(self, period: int) -> int:
        """The most units after a loop's start that an exact cycle of ``period`` units
        (at most ``window``) takes to be flagged."""
        return period + self.ngram - 1 + math.ceil(self.threshold / (1.0 - self.drift))

    def feed(self, text: str) -> bool:
        """Take the next ``text`` of the generation; whether it is flagged now."""
        if self.flagged_at is not None or not text:
            return self.flagged_at is not None
        buffer = self._pending + text
        self._pending = ""
        for match in _UNITS.finditer(buffer):
            word = match.group()
            whole = len(word) if match.end() < len(buffer) else len(word) - len(word) % UNIT_CHARS
            for start in range(0, whole, UNIT_CHARS):
                if self._unit(word[start : min(start + UNIT_CHARS, whole)]):
                    return True
            # A word that reaches the end of the text may go on in the next delta.
            self._pending = word[whole:]
        return False

    def _unit(self, unit: str) -> bool:
        self.units += 1
        self._history.append(unit)
        if len(self._history) < self.ngram:
            return False
        gram = tuple(itertools.islice(self._history, len(self._history) - self.ngram, None))
        last = self._last_seen.get(gram)
        repeat = last is not None and self.units - last <= self.window
        if repeat:
            self._period = self.units - last  # type: ignore[operator]
        elif self._period is not None and self._period < len(self._history):
            # Locked on a period: a unit that continues the copy counts even where a perturbed
            # unit nearby keeps its n-gram from recurring (a near-loop).
            repeat = self._history[-1 - self._period] == unit
        self._last_seen[gram] = self.units
        self._order.append((self.units, gram))
        while self._order[0][0] < self.units - self.window:
            end, old = self._order.popleft()
            if self._last_seen.get(old) == end:
                del self._last_seen[old]
        self.score = max(0.0, self.score + repeat - self.drift)
        # A small tolerance, so that float rounding never delays the flag past flag_bound.
        if self.score >= self.threshold - 1e-9:
            self.flagged_at = self.units
            # Flagged for good: nothing more is needed from the text.
            self._last_seen.clear()
            self._order.clear()
            self._history.clear()
            return True
        return False
