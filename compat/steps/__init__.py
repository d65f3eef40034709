"""The step types, one module each: the dataclass (its fields are the JSON layout and the
schema), its finding codes, its inference (``compat.infer.infer_step``) and its
compatibility rule (``compat.rules.compare``).  Its Spark builder is
``migrate/build/<step>.py``.

Importing this package registers every step; a new step type is a new module here, imported
below, and a builder module (``tests/test_steps.py`` says what else each step needs).
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
