"""A per-generation loop detector fed the output as it arrives (pure, standard library only).

An n-gram repetition CUSUM flags a generation once its repeats are both many and periodic.
A flag becomes certain after ``CERTAIN_UNITS`` units of repetition with no template's slot.
Only a certain flag counts for the trip rule.
The verdict depends only on the text fed, never on how it was cut; flagged stays flagged.
See docs/detector.md for the method, its bounds and its measurement on real outputs.
"""

from __future__ import annotations

import math
import re
from collections import deque

UNIT_CHARS = 4
# A flag is certain once its repeating stretch has gone on this many units: healthy text that
# repeats a block (a list of records, a table) ends first; a loop goes on to the cap.
CERTAIN_UNITS = 512
# Where a reasoning model's thinking ends inside its text, when the server does not split it.
THINKING_ENDS = "</think>"
_PRIME = (1 << 61) - 1
_BASE = 1_000_003
_UNITS = re.compile(r"\w+|[^\w\s]+|\s+")


class LoopDetector:
    """The loop detector of one generation: :meth:`feed` it the new text, in order."""

    def __init__(
        self,
        ngram: int,
        window: int,
        drift: float,
        threshold: float,
        repeats: int = 1,
        certain_units: int = CERTAIN_UNITS,
    ) -> None:
        if ngram < 1 or window < 1 or not 0.0 < drift < 1.0 or threshold <= 0.0 or repeats < 1 or certain_units < 0:
            raise ValueError(f"bad loop detector settings: {ngram=}, {window=}, {drift=}, {threshold=}, {repeats=}")
        self.ngram, self.window, self.drift, self.threshold = ngram, window, drift, threshold
        self.repeats, self.certain_units = repeats, certain_units
        self.units = 0  # units completed so far
        self.flagged_at: int | None = None  # the unit count at which it flagged
        self.certain_at: int | None = None  # the unit count at which its flag became certain
        self.score = 0.0
        self._pending = ""  # an unfinished piece of a run (at most UNIT_CHARS characters)
        # The last units: enough for an n-gram, and for a copy ``window`` units back.
        self._history: deque[str] = deque(maxlen=max(ngram, window + 1))
        self._period: int | None = None  # the distance of the last n-gram that recurred
        self._cycle = 0  # the last period locked on (kept when the lock drops)
        self._stretch = 0  # units since the score was last zero: the repeating stretch
        self._slots: deque[int] = deque(maxlen=8)  # the units of the last template slots seen
        self._template_at = -(1 << 62)  # the unit of the last slot seen a period after another
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

    @property
    def certain(self) -> bool:
        """Flagged, and still repeating ``CERTAIN_UNITS`` units into its repeating stretch."""
        return self.certain_at is not None

    def flag_bound(self, period: int) -> int:
        """The most units after a loop's start that an exact cycle of ``period`` units
        (at most ``window``) takes to be flagged."""
        climb = math.ceil(self.threshold / (1.0 - self.drift))
        return period + self.ngram - 1 + max(climb, (self.repeats - 1) * period)

    def certain_bound(self, period: int) -> int:
        """The most units after a loop's start that an exact cycle of ``period`` units takes to
        make its flag certain."""
        return max(self.flag_bound(period), period + self.ngram - 1 + self.certain_units)

    def feed(self, text: str) -> bool:
        """Take the next ``text`` of the generation; whether it is flagged now (read on until
        its flag is certain)."""
        if self.certain_at is not None or not text:
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
        return self.flagged_at is not None

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
            self._period = self._cycle = units - last
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
                # recurs again. A slot one period after another is a template's for sure (a
                # perturbation of a loop differs twice, then the copies agree again): its
                # repetition is a list of records, never certain.
                self._period = None
                if any(abs(units - period - slot) <= 1 for slot in self._slots):
                    self._template_at = units
                self._slots.append(units)
        last_seen[gram] = units
        order = self._order
        order.append((units, gram))
        while order[0][0] < units - self.window:
            end, old = order.popleft()
            if last_seen.get(old) == end:
                del last_seen[old]
        self.score = max(0.0, self.score + repeat - self.drift)
        self._stretch = self._stretch + 1 if self.score > 0.0 else 0
        # A small tolerance, so that float rounding never delays the flag past flag_bound.
        earned = self.score >= self.threshold - 1e-9 and self._stretch >= (self.repeats - 1) * self._cycle
        if earned and self.flagged_at is None:
            self.flagged_at = units
        exact = units - self._template_at >= self.certain_units  # no template's slot in that stretch
        if self.flagged_at is not None and self._stretch >= self.certain_units and earned and exact:
            self.certain_at = units
            # Certain for good: nothing more is needed from the text.
            last_seen.clear()
            order.clear()
            history.clear()
            codes.clear()
            differs.clear()
            return True
        return False
