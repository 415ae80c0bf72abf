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
costs about two units, not ``ngram``. A unit that differs where the copy a period back differed
too is no perturbation but a template's slot (a step's figures, a record's values: a chain of
thought in repeated steps, rows, an identity matrix); it drops the lock, so that the frame
between its recurring phrases earns nothing until an n-gram recurs again.

Guarantees (tested as properties):

- **Exact cycles.** Once a generation repeats a cycle of period P <= ``window`` units, it is
  flagged at most ``P + ngram - 1 + ceil(threshold / (1 - drift))`` units after the loop's
  first unit (:meth:`LoopDetector.flag_bound`): from then on every n-gram recurs P units back.
- **Near-loops.** A cycle with a share q of its units replaced at random scores about
  about ``1 - 2q`` per unit (the period lock above) while the lock holds; two perturbations a
  period apart drop it (odds about q per perturbation), so the higher q, the slower the flag
  (measured in ``benchmarks/bench_detector.py``: a 5% near-loop of 80 words within about 300
  units; at 15%, thousands).
- **The split does not matter.** The verdict and the unit at which it comes depend only on
  the text fed so far, never on how it was cut into deltas (units are made incrementally,
  holding back only an unfinished piece of a run).
- **Flagged stays flagged**; after the flag, a delta costs nothing and the state is dropped.
- **Bounded cost.** Each delta costs O(len(delta)) and memory is O(window): no re-scan.

Units are a cheap token proxy: a run of word characters (letters, digits), of other
characters that are not white space (punctuation), or of white space less its first
character (which only separates: one space or newline makes no unit, a blank line or an
indentation does, and so does a model that emits nothing but newlines), cut into pieces of
at most ``UNIT_CHARS`` characters. A rule of dashes or equal signs is
then a few units, not dozens (BPE tokenizers merge such runs too). Healthy English and
technical text averages 3.2 characters a unit (the benchmark), about one BPE token; a
character-level tokenizer makes up to ``UNIT_CHARS`` tokens a unit.
"""

from __future__ import annotations

import math
import re
from collections import deque

UNIT_CHARS = 4
_PRIME = (1 << 61) - 1
_BASE = 1_000_003
_UNITS = re.compile(r"\w+|[^\w\s]+|\s+")


class LoopDetector:
    """The loop detector of one generation: :meth:`feed` it the new text, in order."""

    def __init__(self, ngram: int, window: int, drift: float, threshold: float) -> None:
        if ngram < 1 or window < 1 or not 0.0 < drift < 1.0 or threshold <= 0.0:
            raise ValueError(f"bad loop detector settings: {ngram=}, {window=}, {drift=}, {threshold=}")
        self.ngram, self.window, self.drift, self.threshold = ngram, window, drift, threshold
        self.units = 0  # units completed so far
        self.flagged_at: int | None = None  # the unit count at which it flagged
        self.score = 0.0
        self._pending = ""  # an unfinished piece of a run (at most UNIT_CHARS characters)
        # The last units: enough for an n-gram, and for a copy ``window`` units back.
        self._history: deque[str] = deque(maxlen=max(ngram, window + 1))
        self._period: int | None = None  # the distance of the last n-gram that recurred
        # Per unit: whether it differed from the unit a locked period back (a slot, if again).
        self._differs: deque[bool] = deque(maxlen=window + 1)
        self._codes: deque[int] = deque()  # the hashes of the last ``ngram`` units (one more, briefly)
        self._gram = 0  # the rolling hash of the last ``ngram`` units
        self._power = pow(_BASE, ngram, _PRIME)  # what the oldest unit's hash weighs in it
        self._last_seen: dict[int, int] = {}  # n-gram (its hash) -> the unit count it last ended at
        self._order: deque[tuple[int, int]] = deque()  # (end, n-gram), to forget old ones

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
            run = match.group()
            # White space: its first character only separates; the rest of a run (blank lines,
            # indentation, a model that emits nothing but newlines) is cut into units too.
            lead = 1 if run[0].isspace() else 0
            body = run[lead:]
            whole = len(body) if match.end() < len(buffer) else len(body) - len(body) % UNIT_CHARS
            for start in range(0, whole, UNIT_CHARS):
                if self._unit(body[start : min(start + UNIT_CHARS, whole)]):
                    return True
            # A run that reaches the end of the text may go on in the next delta.
            self._pending = run[:lead] + body[whole:] if match.end() == len(buffer) else ""
        return False

    def _unit(self, unit: str) -> bool:
        self.units += 1
        units, history, codes = self.units, self._history, self._codes
        history.append(unit)
        # The n-gram is known by a rolling hash of its units' hashes (mod a 61-bit prime): no
        # tuple is built per unit. A collision (odds about window / 2**61) can only add a repeat.
        code = hash(unit) % _PRIME
        codes.append(code)
        if len(codes) > self.ngram:
            self._gram = (self._gram * _BASE + code - codes.popleft() * self._power) % _PRIME
        else:
            self._gram = (self._gram * _BASE + code) % _PRIME
        if len(codes) < self.ngram:
            return False
        gram = self._gram
        last_seen = self._last_seen
        last = last_seen.get(gram)
        differs = self._differs
        if last is not None and units - last <= self.window:
            repeat = True
            self._period = units - last
            differs.append(False)
        else:
            # Locked on a period: a unit that continues the copy counts even where a perturbed
            # unit nearby keeps its n-gram from recurring (a near-loop).
            period = self._period
            repeat = period is not None and period < len(history) and history[-1 - period] == unit
            differs.append(period is not None and not repeat)
            if period is not None and not repeat and period < len(differs) - 1 and differs[-1 - period]:
                # It differs where the copy a period back differed too: a slot of a template
                # (a step's figures, a record's values) that changes every time, not a
                # perturbation of a loop. Unlocked: its frame earns nothing until an n-gram
                # recurs again.
                self._period = None
        last_seen[gram] = units
        order = self._order
        order.append((units, gram))
        while order[0][0] < units - self.window:
            end, old = order.popleft()
            if last_seen.get(old) == end:
                del last_seen[old]
        self.score = max(0.0, self.score + repeat - self.drift)
        # A small tolerance, so that float rounding never delays the flag past flag_bound.
        if self.score >= self.threshold - 1e-9:
            self.flagged_at = units
            # Flagged for good: nothing more is needed from the text.
            last_seen.clear()
            order.clear()
            history.clear()
            codes.clear()
            differs.clear()
            return True
        return False
