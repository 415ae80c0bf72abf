"""Where a backend's observations go: the interface an evaluation's scope (``state.Probe``)
offers, and a vLLM replica (``vllm.replica_engine.Replica``) offers in its place."""

from __future__ import annotations

from typing import Any, Protocol

from probe.runtime.scope.groups import Request
from probe.runtime.scope.log import ErrorReports


class Observer(Protocol):
    """What a backend's glue reports to while it generates; it never reaches past this."""

    errors: ErrorReports

    def worth_streaming(self, request: Request) -> bool:
        """Whether partial outputs of ``request`` are worth asking for."""
        ...

    def partial(self, request: Request, index: int, text: str) -> None:
        """New text of choice ``index`` of ``request``, as it is generated."""
        ...

    def observe(self, request: Request, response: Any) -> None:
        """How ``request`` ended: ``response`` as an API server's response dict."""
        ...

    def blanks(self, request: Request, cancelled: bool = False) -> list[str]:
        """The blank answers for ``request``, counted as short-circuited or ``cancelled``."""
        ...
