"""lm-eval's data-parallel vLLM backend (``data_parallel_size > 1``), on the driver's side.

Every replica is probed, and one rule and one sidecar judge the whole run. Each prompt's
``SamplingParams`` is a copy tagged with the call's exchange directory, its place and its group.
Replicas append what they observe to files there; a thread here feeds those files to this
process's ``Probe``. A trip writes the sidecar here, once, and a marker file tells every replica
to abort the group. A replica that never reports runs unprobed, and one line says so.
See docs/vllm-offline.md.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from probe.runtime.core.answers import BlankAnswer
from probe.runtime.core.streaming import wanted
from probe.runtime.scope import state
from probe.runtime.scope.groups import Group, Request

TAG = "hyperloom_eval_probe"  # the key in SamplingParams.extra_args
# Each replica's file: one JSON line per request it finished ({"i", "response"}) or blanked
# ({"i", "blank"}), and per piece of partial output ({"i", "partial": choice, "text"}).
REPLICA_FILE = "replica-"
TRIPPED = "tripped-"  # a marker per tripped group: "tripped-<g>"
POLL_S = 0.1  # how often the files are read (here) and the markers looked for (in a replica)


@dataclass
class Exchange:
    """One ``_model_generate`` call spread over replicas: its requests, in the order lm-eval
    passes them, and what the replicas have reported so far."""

    probe: state.Probe
    requests: list[Request]
    directory: str
    groups: list[Group] = field(default_factory=list)  # a group's number is its place here
    offsets: dict[str, int] = field(default_factory=dict)  # how far each replica's file was read
    reported: set[int] = field(default_factory=set)  # prompts a replica observed or blanked
    blanked: set[int] = field(default_factory=set)
    marked: set[int] = field(default_factory=set)  # groups whose marker is written

    def tagged(self, params: list[Any]) -> list[Any]:
        """A copy of each prompt's ``SamplingParams`` carrying its tag (the originals untouched)."""
        numbers: dict[int, int] = {}
        copies = []
        for i, (sampling, request) in enumerate(zip(params, self.requests, strict=True)):
            if id(request.group) not in numbers:
                numbers[id(request.group)] = len(self.groups)
                self.groups.append(request.group)
            tag = {
                "dir": self.directory,
                "i": i,
                "g": numbers[id(request.group)],
                "w": wanted(self.probe.settings, [request]),
            }
            tagged = copy.copy(sampling)
            tagged.extra_args = {**(getattr(sampling, "extra_args", None) or {}), TAG: tag}
            copies.append(tagged)
        return copies

    def drain(self) -> None:
        """Feed the probe what the replicas wrote since the last call, then mark new trips.
        Called by one thread at a time (the follower, then once more after it stopped)."""
        for name in sorted(os.listdir(self.directory)):
            if name.startswith(REPLICA_FILE):
                try:
                    entries = self._new_lines(name)
                except OSError as error:  # that replica's report only: the others are still read
                    self.probe.errors.once("replica file", f"cannot read a replica's report {name} ({error!r})")
                    continue
                for entry in entries:
                    self._feed(entry)
        for number, group in enumerate(self.groups):
            if group.tripped and number not in self.marked:
                self.marked.add(number)
                with open(os.path.join(self.directory, f"{TRIPPED}{number}"), "w"):
                    pass

    def _new_lines(self, name: str) -> list[Any]:
        """The complete lines added to a replica's file since it was last read."""
        with open(os.path.join(self.directory, name), "rb") as file:
            file.seek(self.offsets.get(name, 0))
            data = file.read()
        complete = data[: data.rfind(b"\n") + 1]  # a line being written is read next time
        self.offsets[name] = self.offsets.get(name, 0) + len(complete)
        entries = []
        for line in complete.splitlines():
            try:  # one bad line (a short write on a full disk) costs only itself
                entries.append(json.loads(line))
            except ValueError:
                self.probe.errors.once(
                    "replica json", f"a replica's line is not a whole JSON line ({line[:200]!r}); ignored"
                )
        return entries

    def _feed(self, entry: Any) -> None:
        i = entry.get("i") if isinstance(entry, dict) else None
        if not isinstance(i, int) or not 0 <= i < len(self.requests) or i in self.reported:
            self.probe.errors.once(
                "replica line",
                f"a replica's line names no request of this call left to report ({entry!r:.200}); ignored",
            )
            return
        if "partial" in entry:  # more of a running request's output: for the loop detector
            self.probe.partial(self.requests[i], entry["partial"], entry.get("text"))
            return
        self.reported.add(i)
        if entry.get("blank"):
            self.blanked.add(i)
            self.probe.blanks(self.requests[i], cancelled=True)
        else:
            self.probe.observe(self.requests[i], entry.get("response"))


def generate_across(
    probe: state.Probe, requests: list[Request], params: list[Any], run: Callable[[list[Any]], list[Any]], ray: bool
) -> tuple[list[Any], set[int]]:
    """Run ``run`` (lm-eval's data-parallel generation) on tagged copies of ``params`` while
    following what its replicas report; return its outputs and the places of the prompts a
    replica answered blank (their outputs are the probe's, never the model's).

    ``ray``: lm-eval sends the shares to Ray tasks (else to multiprocessing workers)."""
    directory = None
    try:  # no usable temporary directory (TMPDIR unwritable, or removed since) included
        directory = tempfile.mkdtemp(prefix="hyperloom_eval_probe_replicas-")
        exchange = Exchange(probe, requests, directory)
        tagged = exchange.tagged(params)
        if ray:
            _join_ray()
    except Exception as error:
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
        probe.errors.report("vllm replicas", error)
        return run(params), set()
    stop = threading.Event()
    follower = threading.Thread(target=_follow, args=(exchange, stop), name="lm-eval-probe replicas", daemon=True)
    follower.start()
    try:
        outputs = run(tagged)
    finally:
        stop.set()
        follower.join()
        _follow(exchange, None)  # what the replicas wrote last, before they returned
        shutil.rmtree(directory, ignore_errors=True)
    _count_unreported_blanks(exchange, outputs)
    _say_unreached(exchange)
    return outputs, exchange.blanked


def _count_unreported_blanks(exchange: Exchange, outputs: Any) -> None:
    """Count as the probe's every blank a replica made up but could not report.

    Such an answer is never the model's, nor a prompt that ran unprobed.
    """
    for i, output in enumerate(outputs or ()):
        completions = getattr(output, "outputs", None) or ()
        made_up = isinstance(getattr(completions[0], "text", None), BlankAnswer) if completions else False
        if made_up and i < len(exchange.requests) and i not in exchange.blanked:
            exchange.reported.add(i)
            exchange.blanked.add(i)
            exchange.probe.blanks(exchange.requests[i], cancelled=True)


def _follow(exchange: Exchange, stop: threading.Event | None) -> None:
    """Drain the exchange every POLL_S until ``stop`` is set (once when None); never raises."""
    while True:
        try:
            exchange.drain()
        except Exception as error:
            exchange.probe.errors.report("vllm replicas", error)
        if stop is None or stop.wait(POLL_S):
            return


def _say_unreached(exchange: Exchange) -> None:
    missing = len(exchange.requests) - len(exchange.reported)
    if missing:
        exchange.probe.errors.once(
            "vllm replicas unprobed",
            f"data_parallel_size > 1: {missing} of {len(exchange.requests)} prompts went to vLLM replicas that "
            f"did not load the probe ({len(exchange.offsets)} replica(s) reported): those ran unprobed, and their "
            "answers are vLLM's own. A replica loads it only where it gets this process's environment "
            "(PYTHONPATH) and files: Ray workers on this machine, multiprocessing workers.",
        )


def _join_ray() -> None:
    """Join Ray before lm-eval's first task does, so that its workers get this process's
    ``PYTHONPATH`` (the probe's sitecustomize.py): a cluster started with ``ray start`` does
    not pass a driver's environment on. lm-eval would call ``ray.init()`` with no arguments
    itself, and shuts Ray down after every call; when Ray is already joined, it is left as it is."""
    import ray

    pythonpath = os.environ.get("PYTHONPATH")
    if ray.is_initialized() or not pythonpath:
        return
    # A worker does not start in this directory: relative entries are made absolute here.
    # "${PYTHONPATH}" is the worker's own value: Ray expands it there, so nothing of a
    # remote node's path is lost.
    absolute = os.pathsep.join(os.path.abspath(entry) if entry else entry for entry in pythonpath.split(os.pathsep))
    ray.init(runtime_env={"env_vars": {"PYTHONPATH": f"{absolute}:${{PYTHONPATH}}"}})
