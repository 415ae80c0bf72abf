"""A server's own counters: vLLM's ``/metrics``, or the simulated server's ``/stats``."""

from __future__ import annotations

import json
import urllib.request


def parse_vllm_metrics(text: str) -> dict[str, float]:
    """``generation_tokens`` and ``finished_<reason>`` (stop, length, abort, ...) from
    vLLM's Prometheus text; generated tokens include those of aborted requests."""
    found = {"generation_tokens": 0.0}
    for line in text.splitlines():
        if line.startswith("vllm:generation_tokens_total"):
            found["generation_tokens"] += float(line.split()[-1])
        elif line.startswith("vllm:request_success_total"):
            reason = line.split('finished_reason="', 1)[1].split('"', 1)[0]
            found[f"finished_{reason}"] = found.get(f"finished_{reason}", 0.0) + float(line.split()[-1])
    return found


def vllm_metrics(base_url: str, timeout: float = 10) -> dict[str, float]:
    """Fetch and parse ``base_url``'s /metrics; raises OSError when it cannot be read."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=timeout) as response:
        return parse_vllm_metrics(response.read().decode())


def server_counters(base_url: str) -> tuple[int | None, int | None]:
    """(finished generate requests, generated tokens) from vLLM's /metrics, else from a
    simulated server's /stats; (None, None) when the server exposes neither."""
    try:
        found = vllm_metrics(base_url, timeout=5)
        finished = sum(v for k, v in found.items() if k.startswith("finished_"))
        return int(finished), int(found["generation_tokens"])
    except OSError:
        pass
    try:
        with urllib.request.urlopen(f"{base_url}/stats", timeout=5) as response:
            stats = json.loads(response.read())
        return stats["generate_requests"], stats["tokens_generated"]
    except (OSError, ValueError, KeyError):
        return None, None
