"""The trip rule and the sample it judges (pure).

The rule judges the first places of a group, which hold its seeded sample.
Each generation counts once: pathological, healthy, or not known yet (counted as healthy).
It fires once MIN_SAMPLES outcomes are known and LENGTH_RATIO of the sample is pathological.
So the order in which outcomes arrive can never trip a run.
The sample grows by ``step`` while it leans pathological, up to ``limit``.
See docs/rule.md for the trip-probability table and why it holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The sample grows while its pathological share is at least this fraction of the trip ratio.
REACH = 0.5
# A sample grows to at most this many times its first size (the reserve sent first).
GROWTH = 4


def rule_fires(observed: int, pathological: int, min_samples: int, length_ratio: float) -> bool:
    """True once ``observed >= min_samples`` and ``pathological >= length_ratio * observed``.

    Never without a single pathological observation, whatever the ratio.
    """
    if observed < min_samples or observed <= 0 or pathological <= 0:
        return False
    # A small tolerance so that, say, 7 of 10 meets a ratio of 0.7 despite float rounding.
    return pathological >= length_ratio * observed - 1e-9


def sample_sizes(min_samples: int) -> tuple[int, int, int]:
    """(first, step, limit): the generations a sample starts with, grows by, and grows to."""
    return min_samples, max(1, min_samples // 4), GROWTH * min_samples


@dataclass
class Sample:
    """The places of one group that the rule judges, and their outcomes."""

    min_samples: int
    length_ratio: float
    size: int = 0  # generations in the sample now (0: from sample_sizes), its first places' (see _places)
    step: int = 0
    limit: int = 0
    # place -> the outcome of each of its generations: True pathological, False healthy,
    # None not known yet.
    outcomes: dict[int, list[bool | None]] = field(default_factory=dict)
    expected: int | None = None  # the generations lm-eval will ask of the group (None: not told)
    made: int = 0  # the generations of every place made so far
    # Generations flagged looping, not certain yet: not known, but a sign the sample may lean.
    provisional: set[tuple[int, int]] = field(default_factory=set)

    def __post_init__(self) -> None:
        first, step, limit = sample_sizes(self.min_samples)
        self.size, self.step, self.limit = self.size or first, self.step or step, self.limit or limit

    def expect(self, generations: int) -> None:
        """lm-eval will ask the group for ``generations`` more (a sample never waits for more)."""
        self.expected = (self.expected or 0) + generations
        self._grow()

    def join(self, place: int, generations: int) -> None:
        """The request at ``place`` was made, with ``generations`` answers (once a place: a retry
        keeps its place, and does not join again)."""
        self.made += max(1, generations)
        if place < self.limit:  # a place past the limit is never judged: only counted
            self.outcomes[place] = [None] * max(1, generations)

    def worth_watching(self, place: int | None) -> bool:
        """Whether the partial output of the request at ``place`` may bring the verdict sooner.

        That is while the verdict is not final, and the rule judges that place now or may once the sample grows.
        """
        if place is None or self.final or place >= self._places(self.limit)[0]:
            return False
        judged = self._places(self.size)[0]
        if place < judged:
            return True
        _, known, pathological = self.counts()
        flagged = sum(1 for p, _ in self.provisional if p < judged)
        seen = known + flagged
        return seen > 0 and pathological + flagged >= REACH * self.length_ratio * seen - 1e-9

    def flag(self, place: int | None, index: int) -> None:
        """Generation ``index`` at ``place`` was flagged looping; its outcome is not known yet."""
        if place is not None and place in self.outcomes:
            self.provisional.add((place, index))

    def record(self, place: int | None, index: int, pathological: bool) -> None:
        """The outcome of generation ``index`` at ``place`` (a later one replaces an earlier:
        a flag withdrawn when its generation stops on its own)."""
        outcomes = self.outcomes.get(place) if place is not None else None
        if outcomes is None or not 0 <= index < len(outcomes):
            return
        self.provisional.discard((place, index))
        outcomes[index] = pathological
        self._grow()

    def _places(self, generations: int) -> tuple[int, int]:
        """(the places, in order, that cover the first ``generations`` of the group, those of them
        not made yet). A place not made yet counts as one generation while lm-eval will still ask
        for one (as far as it told: ``expect``), and ends the count otherwise."""
        covered = place = missing = 0
        to_come = max(0, self.expected - self.made) if self.expected is not None else None
        while covered < generations:
            outcomes = self.outcomes.get(place)
            if outcomes is None:
                if to_come is not None and missing >= to_come:
                    break
                missing += 1
            covered += len(outcomes) if outcomes is not None else 1
            place += 1
        return place, missing

    def counts(self) -> tuple[int, int, int]:
        """(generations, known, pathological) over the sample's places (see ``_places``)."""
        places, missing = self._places(self.size)
        generations, known, pathological = missing, 0, 0
        for place in range(places):
            outcomes = self.outcomes.get(place)
            if outcomes is not None:
                generations += len(outcomes)
                known += sum(o is not None for o in outcomes)
                pathological += sum(o is True for o in outcomes)
        return generations, known, pathological

    def fires(self) -> bool:
        """The rule: at least MIN_SAMPLES outcomes of the sample known, and at least LENGTH_RATIO
        of its generations pathological, those not known yet counted as healthy."""
        generations, known, pathological = self.counts()
        return known >= self.min_samples and rule_fires(generations, pathological, self.min_samples, self.length_ratio)

    @property
    def complete(self) -> bool:
        """Every outcome of the sample is known: its verdict is final (it fired, or never will)."""
        generations, known, _ = self.counts()
        return known == generations

    @property
    def final(self) -> bool:
        """Its verdict cannot change: it fired, or it can neither fire nor grow, whatever the
        outcomes not known yet turn out to be."""
        if self.fires():
            return True
        generations, known, pathological = self.counts()
        at_most = pathological + generations - known
        needed = self.length_ratio if self.size >= self.limit else REACH * self.length_ratio
        return at_most < needed * generations - 1e-9

    def _leans(self) -> bool:
        generations, _, pathological = self.counts()
        return pathological >= REACH * self.length_ratio * generations - 1e-9

    def _grow(self) -> None:
        while self.complete and self.size < self.limit and not self.fires() and self._leans():
            self.size = min(self.limit, self.size + self.step)

    def as_dict(self) -> dict[str, object]:
        generations, known, pathological = self.counts()
        return {
            "places": self._places(self.size)[0],
            "generations": generations,
            "known": known,
            "pathological": pathological,
            "complete": known == generations,
        }


def trip_probability(p: float, min_samples: int, length_ratio: float) -> float:
    """The probability that the rule trips a group whose generations are each pathological with
    probability ``p``, independently: exact, over the sizes the sample passes through. It does
    not depend on the order outcomes arrive in (see the module's docstring)."""
    first, step, limit = sample_sizes(min_samples)
    alive = _binomial(first, p)  # alive[k]: P(k pathological among the sample, still open)
    size, tripped = first, 0.0
    while True:
        grows = size < limit
        nxt = [0.0] * (len(alive))
        for k, weight in enumerate(alive):
            if rule_fires(size, k, min_samples, length_ratio):
                tripped += weight
            elif grows and k >= REACH * length_ratio * size - 1e-9:
                nxt[k] += weight
        if not grows or not any(nxt):
            return tripped
        added = min(limit, size + step) - size
        alive = [0.0] * (len(nxt) + added)
        for k, weight in enumerate(nxt):
            for j, chance in enumerate(_binomial(added, p)):
                alive[k + j] += weight * chance
        size += added


def _binomial(n: int, p: float) -> list[float]:
    from math import comb

    return [comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)]
