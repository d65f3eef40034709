"""Python-side profiles of the changelog operators' workers (issue 31: where the time goes).

``THESEUS_PY_PROFILE=<folder>`` in the environment of the process that *builds* the query
makes every ``transformWithStateInPandas`` operator it builds (``migrate.build.changelog``)
profile its Python worker with :mod:`cProfile`, from the operator's ``init`` in a task to
its ``close``: PySpark's own per-group work (the Arrow batches read and regrouped per key,
a pandas frame per key, each output frame converted back to Arrow, the state calls over
the state server's socket) as well as the group function.  Each task writes
``<folder>/<state name>.<pid>.<random>.prof`` (a reused worker runs many tasks, each
with a processor unpickled afresh); :func:`summary` adds them up.

The switch is read once, when the operator is built: with it unset the built processor is
the plain class, so a query built without it pays nothing per group or per task.  The
folder must be one the workers can write (local mode: this machine).
"""

from __future__ import annotations

import os
import pstats
import uuid
from pathlib import Path
from typing import Any

ENV = "THESEUS_PY_PROFILE"


def profile_dir() -> str | None:
    """The folder named by the switch, or None when profiling is off."""
    return os.environ.get(ENV) or None


def profiled(cls: type, folder: str, label: str) -> type:
    """A subclass of the StatefulProcessor class ``cls`` whose tasks profile themselves
    into ``folder``, their files named after ``label`` (the operator's state name)."""
    class Profiled(cls):  # type: ignore[valid-type,misc]
        def init(self, handle: Any) -> None:
            import cProfile

            # the driver's pre-init calls init and close too: a tiny profile among the tasks'
            self._theseus_profile = cProfile.Profile()
            self._theseus_profile.enable()
            super().init(handle)

        def close(self) -> None:
            super().close()
            prof = getattr(self, "_theseus_profile", None)
            if prof is None:
                return
            prof.disable()
            self._theseus_profile = None
            Path(folder).mkdir(parents=True, exist_ok=True)
            name = f"{label}.{os.getpid()}.{uuid.uuid4().hex[:12]}.prof"
            prof.dump_stats(str(Path(folder) / name))

    Profiled.__name__ = Profiled.__qualname__ = f"Profiled{cls.__name__}"
    return Profiled


def summary(folder: str | Path, label: str | None = None) -> pstats.Stats | None:
    """Every profile in ``folder`` (those of operator ``label`` only, when given) added up;
    None when there is none."""
    files = sorted(str(p) for p in Path(folder).glob(f"{label or '*'}.*.prof"))
    if not files:
        return None
    stats = pstats.Stats(files[0])
    for f in files[1:]:
        stats.add(f)
    return stats


def labels(folder: str | Path) -> list[str]:
    """The operators (state names) that left profiles in ``folder``."""
    return sorted({p.name.split(".", 1)[0] for p in Path(folder).glob("*.prof")})
