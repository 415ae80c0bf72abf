"""Reading ``python -X importtime`` output: what a sitecustomize.py costs and imports."""

from __future__ import annotations


def sitecustomize_cost(stderr: str) -> tuple[int, list[str]]:
    """(cumulative microseconds of the ``sitecustomize`` import, the modules it imported).

    Raises ValueError when the output shows no sitecustomize import at all.
    """
    lines = [line for line in stderr.splitlines() if line.startswith("import time:")]
    names = [line.split("|")[-1] for line in lines]
    index = next((i for i, name in enumerate(names) if name.strip() == "sitecustomize"), None)
    if index is None:
        raise ValueError("no sitecustomize import in this -X importtime output")
    depth = len(names[index]) - len(names[index].lstrip())
    # Imports made by sitecustomize are listed just before it, indented deeper.
    nested = []
    for name in reversed(names[:index]):
        if len(name) - len(name.lstrip()) <= depth:
            break
        nested.append(name.strip())
    return int(lines[index].split("|")[1]), nested
