"""The per-evaluation state: one scope per evaluation, its groups, gates, tasks and sidecar
ownership, the report to ``eval-probe run``, and the runtime's one voice on stderr."""
