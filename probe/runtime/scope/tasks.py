"""Which task each prompt belongs to, and every task's evidence.

Prompts are registered with their task by ``generate_until``, and looked up by text and group.
A prompt that several tasks share goes to each task in turn, one per request.
See docs/evidence.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from probe.runtime.core.evidence import TaskEvidence


def prompt_text(context: Any) -> str | None:
    """The text of a prompt as lm-eval passes it (a string, or a chat as JSON); None for
    token ids, which cannot be matched back to a task."""
    if isinstance(context, str):
        return context
    prompt = getattr(context, "prompt", None)  # lm-eval's JsonChatStr
    return prompt if isinstance(prompt, str) else None


class TaskBook:
    """Prompt -> tasks (one per request made with it), and the evidence gathered per task
    (None: the task is unknown)."""

    def __init__(self) -> None:
        self._by_prompt: dict[tuple[str, str], list[str | None]] = {}
        self._taken: dict[tuple[str, str], int] = {}
        self.evidence: dict[str | None, TaskEvidence] = {}
        self.tasks_of_group: dict[str, set[str]] = {}

    def of(self, task: str | None) -> TaskEvidence:
        found = self.evidence.get(task)
        if found is None:
            found = self.evidence[task] = TaskEvidence()
        return found

    def register(self, entries: Iterable[tuple[Any, str, str | None]]) -> None:
        """Record (prompt, group key, task) for every generate request lm-eval asked for."""
        for context, group, task in entries:
            text = prompt_text(context)
            if text is not None:
                self._by_prompt.setdefault((text, group), []).append(task)
            evidence = self.of(task)
            evidence.requested += 1
            evidence.groups.add(group)
            if task is not None:
                self.tasks_of_group.setdefault(group, set()).add(task)

    def take(self, context: Any, group: str) -> str | None:
        """The task of the next request made with this prompt in this group: the tasks that
        registered it, in turn (requests with the same prompt and settings cannot be told
        apart, so each task gets as many as it registered). The group's only task when the
        prompt cannot be matched; None when that cannot be told."""
        text = prompt_text(context)
        tasks = self._by_prompt.get((text, group)) if text is not None else None
        if tasks:
            taken = self._taken.get((text, group), 0)  # type: ignore[arg-type]
            self._taken[(text, group)] = taken + 1  # type: ignore[index]
            return tasks[taken % len(tasks)]
        known = self.tasks_of_group.get(group, set())
        return next(iter(known)) if len(known) == 1 else None
