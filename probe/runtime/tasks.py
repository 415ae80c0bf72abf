"""Which task each prompt belongs to, and every task's evidence.

lm-eval hands a model all generate requests of a run at once (every task's), grouped only
by generation settings, and the request paths see prompts, not tasks. So the prompts are
registered with their task when ``generate_until`` is called, and looked up by their text
(and group) when a response comes back.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from probe.runtime.evidence import TaskEvidence


def prompt_text(context: Any) -> str | None:
    """The text of a prompt as lm-eval passes it (a string, or a chat as JSON); None for
    token ids, which cannot be matched back to a task."""
    if isinstance(context, str):
        return context
    prompt = getattr(context, "prompt", None)  # lm-eval's JsonChatStr
    return prompt if isinstance(prompt, str) else None


class TaskBook:
    """Prompt -> task, and the evidence gathered per task (None: the task is unknown)."""

    def __init__(self) -> None:
        self._by_prompt: dict[tuple[str, str], str | None] = {}
        self.evidence: dict[str | None, TaskEvidence] = {}
        self.tasks_of_group: dict[str, set[str]] = {}

    def of(self, task: str | None) -> TaskEvidence:
        found = self.evidence.get(task)
        if found is None:
            found = self.evidence[task] = TaskEvidence()
        return found

    def register(self, entries: Iterable[tuple[Any, str, str | None]]) -> None:
        """Record (prompt, group key, task) for every generate request lm-eval asked for.

        A prompt that two tasks share with the same settings is the same request: the
        first task registered keeps it.
        """
        for context, group, task in entries:
            text = prompt_text(context)
            if text is not None:
                self._by_prompt.setdefault((text, group), task)
            evidence = self.of(task)
            evidence.requested += 1
            evidence.groups.add(group)
            if task is not None:
                self.tasks_of_group.setdefault(group, set()).add(task)

    def task_of(self, context: Any, group: str) -> str | None:
        """The task of a prompt in a group; the group's only task when the prompt cannot be
        matched; None when that cannot be told."""
        text = prompt_text(context)
        if text is not None and (text, group) in self._by_prompt:
            return self._by_prompt[(text, group)]
        tasks = self.tasks_of_group.get(group, set())
        return next(iter(tasks)) if len(tasks) == 1 else None
