"""Generate calls in flight on the async path, per group, so that a trip can cancel them."""

from __future__ import annotations

import asyncio
from typing import Any


class InFlight:
    """The asyncio tasks of one group's calls that have passed the gate."""

    def __init__(self) -> None:
        self._tasks: dict[asyncio.Future, Any] = {}

    def add(self, task: asyncio.Future, request: Any) -> None:
        self._tasks[task] = request

    def discard(self, task: asyncio.Future) -> None:
        self._tasks.pop(task, None)

    def cancel_all(self) -> None:
        """Cancel every call still running, except the one running this code.

        The request whose answer tripped the rule is still running when this is called:
        its real answer is kept, so it is not cancelled.
        """
        try:
            current = asyncio.current_task()
        except RuntimeError:
            current = None
        for task, request in list(self._tasks.items()):
            if task is current or task.done():
                continue
            request.cancelled_by_probe = True
            task.cancel()
