"""The step types, one module each.  A step module holds everything about its step:

- the dataclass (its fields are the JSON layout and the plan schema) and its finding codes
  (``register_codes``);
- its inference (``@infer_step.register``, ``compat.infer``): what it outputs, or why Spark
  could not run it;
- its column demand (``@reads.register``, ``compat.demand``: which columns of each input it
  needs for the columns demanded of its output; the SQL compiler's pruning, the fleet's
  contracts and the state rules use it) and how Spark's optimizer moves a filter's
  conjunct through it (``@moves_filter.register``: which columns reach a stateful step);
- its compatibility rule (``@compare.register``, ``compat.rules``);
- then, at the end of the module and in this order, its sharing signature
  (``@sign_step.register``, ``compat.signing``: what of it counts when queries of a fleet
  compute the same subplan), its predicate pushdown (``@push_through.register``,
  ``compat.pushdown``: where a filter's conjunct over its output may go below it, and
  rewritten how) and its PySpark export (``@export_step.register``, ``compat.pyspark_text``:
  its lines of a ``plan export --pyspark`` job, or ``refuse`` with why the DataFrame API
  cannot say it).

A step that must not share, let a conjunct pass or be exported says so in its registration:
nothing falls back for a step that registered nothing.  Its Spark builder is
``migrate/build/<step>.py`` (``@build_step.register``: Spark stays out of ``compat``).

Importing this package registers every step; a new step type is a new module here, imported
below, and a builder module imported in ``migrate/build/__init__.py``; then
``python scripts/gen_plan_schema.py`` and fixtures (``tests/test_steps.py`` fails until each
registration and fixture is there).
"""

from __future__ import annotations

from compat.steps.aggregate import Aggregate
from compat.steps.deduplicate import Deduplicate
from compat.steps.explode import Explode
from compat.steps.filter import Filter
from compat.steps.gates import StartGate, StopGate
from compat.steps.join import Join
from compat.steps.project import Project
from compat.steps.recursive import Feedback, Recursive
from compat.steps.sink import Sink
from compat.steps.source import Source
from compat.steps.top_n import TopN
from compat.steps.union import Union

__all__ = ["Aggregate", "Deduplicate", "Explode", "Feedback", "Filter", "Join", "Project",
           "Recursive", "Sink", "Source", "StartGate", "StopGate", "TopN", "Union"]
