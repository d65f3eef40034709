"""Plan -> Spark (``migrate.build.core``), one module per step type registering its builder
with ``build_step``.  Importing this package registers them all."""

from __future__ import annotations

from migrate.build import (  # noqa: F401  (each registers its step's builder)
    aggregate,
    deduplicate,
    explode,
    filter,
    gates,
    join,
    project,
    recursive,
    sink,
    source,
    top_n,
    union,
)
from migrate.build.core import OP, SOURCE_FORMAT, Builder, BuildOptions, build_step

__all__ = ["OP", "SOURCE_FORMAT", "BuildOptions", "Builder", "build_step"]
