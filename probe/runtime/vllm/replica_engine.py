"""Inside one replica of lm-eval's data-parallel vLLM backend: invasive patches.

The wrapped ``LLM.generate`` acts only on a call whose every prompt carries the driver's tag.
It takes the tags off, so vLLM gets the driver's settings as they were; other calls pass untouched.
The replica reports what its engine does to the exchange directory, and judges nothing.
It aborts a group once the driver's trip marker appears, and reports those blank answers too.
It imports only the standard library and vLLM. See docs/vllm-offline.md.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Callable
from typing import Any

from probe.runtime.core.answers import blanks
from probe.runtime.hooking.integration import Integration
from probe.runtime.hooking.patching import mark, restore_where, wrap
from probe.runtime.hooking.versions import VLLM
from probe.runtime.scope.groups import Group, Request
from probe.runtime.scope.log import ErrorReports, say_once
from probe.runtime.vllm import vllm_offline
from probe.runtime.vllm.replicas import POLL_S, REPLICA_FILE, TAG, TRIPPED


class Replica:
    """This replica's share of one tagged call: the ``Observer`` its ``EngineCall`` reports to, in
    place of an evaluation's scope, and the markers it looks for."""

    def __init__(self, directory: str, places: list[int], numbers: list[int]) -> None:
        self.errors = ErrorReports()
        self.directory = directory
        groups = {number: Group(key=str(number), gen_kwargs={}) for number in dict.fromkeys(numbers)}
        self.groups = list(groups.values())
        self.requests = [Request(groups[number], [None], 0, False, backend=vllm_offline.BACKEND) for number in numbers]
        self.place = {id(request): i for request, i in zip(self.requests, places, strict=True)}
        self.number = {id(group): number for number, group in groups.items()}
        name = f"{REPLICA_FILE}{os.getpid()}-{time.monotonic_ns()}.jsonl"
        # Exclusive: a second call never appends to another's file. Raises when the directory
        # is not there (a replica on another machine).
        self.fd = os.open(os.path.join(directory, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        self.next_look = 0.0

    def _write(self, entry: dict[str, Any]) -> None:
        """Append one whole line; never raises (the generation matters more than its report:
        the driver counts a blank it was not told of from the answer itself)."""
        data = (json.dumps(entry) + "\n").encode("utf-8")
        try:
            while data:  # a short write (a full disk) goes on where it stopped
                written = os.write(self.fd, data)
                if written <= 0:
                    raise OSError(f"wrote nothing of {len(data)} bytes")
                data = data[written:]
        except OSError as error:
            self.errors.once(
                "replica write", f"this vLLM replica cannot write to its run's exchange directory ({error!r}); "
                "what it saw from now on is missing from the run's evidence",
            )  # fmt: skip

    def observe(self, request: Request, response: Any) -> None:
        self._write({"i": self.place[id(request)], "response": response})

    def partial(self, request: Request, index: int, text: str) -> None:
        """More output of a running request (as ``Probe.partial`` takes it): for the driver's
        loop detector, which judges it with the rest of the run."""
        self._write({"i": self.place[id(request)], "partial": index, "text": text})

    def worth_streaming(self, request: Request) -> bool:
        """Whether to read its partial output: the driver decided for the whole call (``watch``)."""
        return True

    def blanks(self, request: Request, cancelled: bool = False) -> list[str]:
        self._write({"i": self.place[id(request)], "blank": True})
        return blanks(request.n_answers)

    def newly_tripped(self) -> list[Group]:
        """The groups whose marker appeared since the last look (looked for every POLL_S)."""
        now = time.monotonic()
        if now < self.next_look:
            return []
        self.next_look = now + POLL_S
        markers = {name for name in os.listdir(self.directory) if name.startswith(TRIPPED)}
        tripped = [g for g in self.groups if not g.tripped and f"{TRIPPED}{self.number[id(g)]}" in markers]
        for group in tripped:
            group.tripped = True
        return tripped

    def close(self) -> None:
        os.close(self.fd)


class ReplicaCall(vllm_offline.EngineCall):
    """An engine call in a replica: after each step, what the driver tripped is aborted too."""

    def after_step(self, outputs: Any) -> None:
        super().after_step(outputs)
        for group in self.probe.newly_tripped():
            if id(group) not in self.handled:
                self.handled.add(id(group))
                self.abort(group)


def share(params: Any) -> tuple[str, list[int], list[int], list[Any], bool] | None:
    """What a tagged call's prompts carry; None for any call the driver did not tag.

    That is the exchange directory, places and groups, and the settings with the tags taken off.
    It also says whether the driver asks for partial outputs, for its loop detector.
    """
    if not isinstance(params, list) or not params:
        return None
    tags = [(getattr(p, "extra_args", None) or {}).get(TAG) for p in params]
    if not all(isinstance(tag, dict) and _well_formed(tag) for tag in tags):
        if any(tags):
            say_once("a vLLM call with only some of its prompts tagged by the probe runs unprobed")
        return None
    directories = {tag.get("dir") for tag in tags}
    if len(directories) != 1:
        say_once("a vLLM call whose prompts name several probed calls runs unprobed")
        return None
    untagged = []
    for sampling in params:
        plain = copy.copy(sampling)
        plain.extra_args = {k: v for k, v in sampling.extra_args.items() if k != TAG} or None
        untagged.append(plain)
    watch = all(tag.get("w") is True for tag in tags)
    return directories.pop(), [tag["i"] for tag in tags], [tag["g"] for tag in tags], untagged, watch


def _well_formed(tag: dict[str, Any]) -> bool:
    return isinstance(tag.get("dir"), str) and all(type(tag.get(key)) is int for key in ("i", "g"))


def _replica_generate(original: Callable) -> Callable:
    def generate(self: Any, prompts: Any, sampling_params: Any = None, *args: Any, **kwargs: Any) -> Any:
        try:
            shared = share(sampling_params)
        except Exception as error:  # tags it cannot read: vLLM ignores them, so the call runs as it is
            say_once(f"cannot read the probe's tags on this vLLM call ({error!r}); it runs unprobed")
            shared = None
        if shared is None:
            return original(self, prompts, sampling_params, *args, **kwargs)
        directory, places, numbers, params, watch = shared
        try:
            replica = Replica(directory, places, numbers)
        except Exception as error:
            say_once(
                f"this vLLM replica cannot reach its run's exchange directory ({error!r}; a replica on another "
                "machine?): it runs unprobed"
            )
            return original(self, prompts, params, *args, **kwargs)
        try:
            return _watched(replica, self, prompts, params, watch, original, args, kwargs)
        finally:
            replica.close()

    return mark(generate, original)


def _watched(
    replica: Replica, llm: Any, prompts: Any, params: list, watch: bool, original: Callable, args: Any, kwargs: Any
) -> Any:
    engine = vllm_offline.hook_engine(llm)
    if engine is None:  # said once: unprobed, and the driver says which prompts went unobserved
        return original(llm, prompts, params, *args, **kwargs)
    call = ReplicaCall(replica, engine, replica.requests, watch=watch)  # type: ignore[arg-type]
    token = vllm_offline.CURRENT_CALL.set(call)
    try:
        outputs = original(llm, prompts, params, *args, **kwargs)
    finally:
        vllm_offline.CURRENT_CALL.reset(token)
    return call.answers(list(outputs))


def install_replica(llm_module: Any) -> None:
    """Wrap vLLM's ``LLM.generate`` (idempotent). Raises LookupError, having patched nothing,
    when vLLM's module has no such method."""
    if not callable(getattr(llm_module, "LLM", None)) or "generate" not in llm_module.LLM.__dict__:
        raise LookupError("vLLM's LLM class has no generate method as this probe knows it")
    wrap(llm_module.LLM, "generate", _replica_generate)


def uninstall_replica(llm_module: Any) -> None:
    restore_where(lambda owner, name: owner is getattr(llm_module, "LLM", None) and name == "generate")


INTEGRATION = Integration(
    waits_for="vllm.entrypoints.llm",
    install=install_replica,
    uninstall=uninstall_replica,
    tested=(VLLM,),
    unprobed="the replicas of lm-eval's data-parallel vLLM backend",
    in_lm_eval=False,
)
