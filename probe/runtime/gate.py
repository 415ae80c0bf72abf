"""The outer gate: at most ``num_concurrent`` generate calls past the point of no return.

lm-eval builds every request's payload before it awaits its own semaphore, so all of them
carry their ``max_tokens`` from the start; holding the calls here instead keeps the rest
cancellable. One gate per event loop, because lm-eval calls ``asyncio.run`` (a new loop)
for every batch of requests and an asyncio primitive belongs to one loop.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from typing import Any


class Gates:
    """One semaphore per running event loop, as wide as the model's ``num_concurrent``."""

    def __init__(self) -> None:
        self._by_loop: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._by_loop)

    def for_running_loop(self, lm: Any) -> asyncio.Semaphore | None:
        """The gate of the running loop, or None when the model has no usable concurrency."""
        size = getattr(lm, "_concurrent", None)
        if not isinstance(size, int) or size < 1:
            return None
        loop = asyncio.get_running_loop()
        with self._lock:
            gate = self._by_loop.get(loop)
            if gate is None:
                gate = self._by_loop[loop] = asyncio.Semaphore(size)
        return gate
