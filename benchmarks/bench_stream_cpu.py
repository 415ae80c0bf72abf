"""CPU time per streamed token in lm-eval's process: what streamed evidence costs the client.

One completion of ``--tokens`` tokens, streamed as vLLM sends it (one server-sent event per
token, then the finish, the usage chunk and ``[DONE]``), goes through the probe's client path:
``EventLines`` -> ``Reassembly`` (parsing and reassembling), then ``Probe.partial`` with the
loop detector off, then on. The figure is CPU time (``time.process_time``, the best of
``--reps``) per token, so that a shared machine's load changes it less than wall time would.
aiohttp's own reading of the lines is not included. Multiplied by the tokens per second a
server streams to one lm-eval process, it says what share of a core the probe then needs:
where that nears one core, generations slow down (the simulated server's healthy profiles
stream about 47,000 and 448,000 tokens per second at C=64; see docs/benchmarks.md, "Streaming cost").

    python benchmarks/bench_stream_cpu.py [--tokens 4096] [--reps 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from probe.runtime.core.contract import Settings  # noqa: E402
from probe.runtime.core.stream import EventLines, Reassembly  # noqa: E402
from probe.runtime.scope import state  # noqa: E402

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "with",
    "was",
    "on",
    "be",
    "by",
    "this",
    "are",
    "from",
    "at",
    "an",
    "which",
    "or",
]


class Model:
    """What ``Probe.request`` keeps of lm-eval's model: its name and address."""

    model = "m"
    base_url = "http://127.0.0.1:9/v1/completions"


def event_lines(tokens: int, seed: int = 1) -> list[bytes]:
    """The lines of one streamed completion of ``tokens`` random words, as vLLM frames them."""
    rng = random.Random(seed)
    head = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m"}

    def chunk(text: str, finish: str | None) -> dict:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
        return {**head, "choices": [choice], "usage": None}

    def events() -> Iterator[dict | str]:
        for _ in range(tokens):
            yield chunk(" " + rng.choice(WORDS), None)
        yield chunk("", "length")
        usage = {"prompt_tokens": 5, "completion_tokens": tokens, "total_tokens": tokens + 5}
        yield {**head, "choices": [], "usage": usage}
        yield "[DONE]"

    lines = []
    for event in events():
        data = event if isinstance(event, str) else json.dumps(event)
        lines += [f"data: {data}\n".encode(), b"\n"]
    return lines


def cpu_per_token(lines: list[bytes], tokens: int, reps: int, partial: bool, detector: bool) -> float:
    """Microseconds of CPU per token through the client path, the best of ``reps``."""
    probe = state.Probe(Settings(detector=detector, min_samples=10**6))  # a rule that cannot fire
    best = float("inf")
    for rep in range(reps):
        request = probe.request(Model(), {"max_tokens": 16384}, [f"prompt {rep}"], 16384)
        start = time.process_time()
        events, whole = EventLines(), Reassembly(1)
        for line in lines:
            for data in events.feed(line):
                for index, text in whole.add_event(data):
                    if partial:
                        probe.partial(request, index, text)
        whole.response()
        best = min(best, time.process_time() - start)
    return best / tokens * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    lines = event_lines(args.tokens)
    figures = {
        "tokens": args.tokens,
        "reps": args.reps,
        "parse_and_reassemble_us": cpu_per_token(lines, args.tokens, args.reps, partial=False, detector=False),
        "with_partial_detector_off_us": cpu_per_token(lines, args.tokens, args.reps, partial=True, detector=False),
        "with_partial_detector_on_us": cpu_per_token(lines, args.tokens, args.reps, partial=True, detector=True),
    }
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        for name, value in figures.items():
            print(f"{name}: {value:.1f}" if isinstance(value, float) else f"{name}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
