"""A server's own counters: vLLM's ``/metrics``, or the simulated server's ``/stats``."""

from __future__ import annotations

import http.client
import json
import math
import urllib.request

# What reading a URL raises when the other end is down, slow, or does not speak HTTP
# (http.client's BadStatusLine and LineTooLong are not OSErrors).
UNREADABLE = (OSError, http.client.HTTPException)


def parse_vllm_metrics(text: str) -> dict[str, float]:
    """``generation_tokens`` and ``finished_<reason>`` (stop, length, abort, ...) from
    vLLM's Prometheus text; generated tokens include those of aborted requests. ValueError
    when a vLLM counter is malformed (no reason label, not a finite number)."""
    found = {"generation_tokens": 0.0}
    for line in text.splitlines():
        if line.startswith("vllm:generation_tokens_total"):
            found["generation_tokens"] += _count(line)
        elif line.startswith("vllm:request_success_total"):
            if 'finished_reason="' not in line:
                raise ValueError(f"no finished_reason in {line!r}")
            reason = line.split('finished_reason="', 1)[1].split('"', 1)[0]
            found[f"finished_{reason}"] = found.get(f"finished_{reason}", 0.0) + _count(line)
    return found


def _count(line: str) -> float:
    value = float(line.split()[-1])
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"not a count: {line!r}")
    return value


def vllm_metrics(base_url: str, timeout: float = 10) -> dict[str, float]:
    """Fetch and parse ``base_url``'s /metrics; raises OSError when it cannot be read, ValueError
    when what it reads is malformed."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=timeout) as response:
        return parse_vllm_metrics(response.read().decode())


def server_counters(base_url: str) -> tuple[int | None, int | None]:
    """(finished generate requests, generated tokens) from the server at ``base_url``.

    They come from vLLM's /metrics, else from a simulated server's /stats. (None, None) when neither
    answers with those counts: unknown, never a made-up zero.
    """
    try:
        with urllib.request.urlopen(f"{base_url}/metrics", timeout=5) as response:
            text = response.read().decode()
        if "vllm:generation_tokens_total" in text:  # else another server's metrics: no count of ours
            found = parse_vllm_metrics(text)
            finished = sum(v for k, v in found.items() if k.startswith("finished_"))
            return int(finished), int(found["generation_tokens"])
    except (*UNREADABLE, ValueError):
        pass
    try:
        with urllib.request.urlopen(f"{base_url}/stats", timeout=5) as response:
            stats = json.loads(response.read())
        counts = stats["generate_requests"], stats["tokens_generated"]
    except (*UNREADABLE, ValueError, KeyError, TypeError, IndexError):
        return None, None
    if all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
        return counts
    return None, None
