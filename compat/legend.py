"""The one legend of the marks reports and trees use: step classes and changelog modes.

``theseus plan show`` prints it under the tree and ``theseus check --help`` ends with it.  It
imports nothing, so the CLI can build its help text without loading the checker; a test keeps
it in step with the step registry and ``compat.infer``'s modes.
"""

from __future__ import annotations

LEGEND = """\
Legend:
  enforcing    a step the check pairs and compares across versions (source,
               aggregate, join, deduplicate, top_n, recursive, sink): its state
               and output must match for the new plan to restart in place
  passive      a step between them (filter, project, explode, union): free to
               change; findings say what the change means for the output
  stateful     the step keeps state in the checkpoint
  [I]          changelog mode: inserts only, every row is final (append)
  [I,UA]       upserts: a row replaces the last row with its key (update)
  [I,UB,UA,D]  retractions: rows are also withdrawn and replaced (update
               before, update after, delete), e.g. a filter over upserts
"""

__all__ = ["LEGEND"]
