"""``theseus check --checkpoint DIR NEW`` and ``theseus check --query NAME --state STORE NEW``.

1. Load and validate the new plan (a bad plan fails before Spark starts).
2. Read the checkpoint in plain Python (``compat.checkpoint``): not a checkpoint, no
   committed batch, a corrupted log file fail here, exit 2, before Spark starts.
3. Learn the new plan's stateful operators from Spark (``migrate.stateops``: a dry run on
   empty input) and, with a recorded plan, the recorded plan's too; in the form that wrote
   the checkpoint (:func:`dry_run_form`).
4. Drift first: when the checkpoint is not what the recorded plan makes, say so.
5. Compare the new plan with the checkpoint (``compat.checkpoint_check``); with a recorded
   plan and no drift, add the plan check of the recorded plan against the new one (it knows
   what a checkpoint does not hold: the sink, window sizes, join types, expressions).
6. The verdict is the worst effect; ``checkpoint.restart`` predicts what Spark does.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any

from compat.check import Report, load_plan
from compat.checkpoint import CheckpointError, read_checkpoint
from compat.checkpoint_check import checkpoint_report
from compat.model import Plan

_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):(//)?")


def local_checkpoint(status: dict[str, Any]) -> tuple[str | None, str | None]:
    """Where the query's recorded checkpoint can be read on this host: ``(path, None)``, or
    ``(None, why not)`` when it cannot be (no checkpoint recorded, a non-local URI such as
    ``s3a://`` or ``hdfs://``, a directory on another host).  A ``file:`` URI is a local
    path; a local path that is not a directory on the query's own host is returned as is
    (the query never wrote it: there is nothing to restart from)."""
    ck = status.get("checkpoint")
    if not ck:
        return None, "the store records no checkpoint for the query"
    ck = str(ck)
    m = _URI.match(ck)
    if m and len(m.group(1)) > 1:  # one letter is a Windows drive, not a scheme
        if m.group(1).lower() != "file":
            return None, (f"the checkpoint {ck} is not on a local filesystem "
                          f"({m.group(1)}:): Theseus reads checkpoints from local disk only")
        ck = ck[m.end():] if m.group(2) else ck[len(m.group(1)) + 1:]
        ck = "/" + ck.lstrip("/")
    host = status.get("host")
    if not Path(ck).is_dir() and host != socket.gethostname():
        if not host:
            return None, (f"the checkpoint {ck} is not on this host "
                          f"({socket.gethostname()}), and the store does not record which "
                          "host holds it")
        return None, (f"the checkpoint {ck} is on host '{host}', not on this host "
                      f"({socket.gethostname()})")
    return ck, None


def locate(store_spec: str, query: str) -> tuple[str, Plan | None]:
    """The checkpoint directory and recorded plan of ``query`` in the store; an error that
    says on which host the checkpoint is when it is not on this one."""
    from migrate.store import open_store

    store = open_store(store_spec)
    instance = store.live_instance(query)
    status = store.status(instance)
    if not status:
        raise CheckpointError(f"no query named '{query}' in the store", file=str(store),
                              expected="a query started with theseus run", found=repr(query))
    ck = status.get("checkpoint")
    if not ck:
        raise CheckpointError(f"the store records no checkpoint for '{query}'",
                              file=str(store), expected="status.json with a checkpoint",
                              found="none")
    host = status.get("host")
    path, why = local_checkpoint(status)
    if path is None and "not on a local filesystem" in (why or ""):
        raise CheckpointError(f"the checkpoint of '{query}' is not on a local filesystem",
                              file=str(ck), expected="a local directory (or file: URI)",
                              found=str(ck),
                              hint="copy the checkpoint to local disk and run theseus check "
                                   "--checkpoint DIR NEW")
    if path is None and not host:
        raise CheckpointError(f"the checkpoint of '{query}' is not on this host", file=ck,
                              expected=f"a directory on this host ({socket.gethostname()})",
                              found="no such directory, and no host recorded",
                              hint="run this check where the query runs, or with "
                                   "--checkpoint DIR on a copy of its checkpoint")
    if path is None:
        raise CheckpointError(f"the checkpoint of '{query}' is on another host",
                              file=ck, expected=f"this host ({socket.gethostname()})",
                              found=f"host '{host}'",
                              hint=f"run this check on {host}, where the checkpoint is "
                                   f"({ck})")
    ck = path
    plan_path = store.plan_path(instance)
    recorded = load_plan(str(plan_path)) if plan_path.exists() else None
    return ck, recorded


def recorded_from(store_spec: str, query: str) -> str:
    """The user's file the store's recorded plan of ``query`` was made from, for the drift
    finding: ``FILE (sha256:…, changed since)``; "" when the store does not say.  A job
    file is what users edit, so a drift names it and says whether it changed since."""
    from migrate.record import source_changed, user_source
    from migrate.store import open_store

    store = open_store(store_spec)
    file, digest = user_source(store, store.live_instance(query))
    if not file:
        return ""
    if not digest:
        return file
    changed = source_changed(file, digest)
    return f"{file} ({digest[:len('sha256:') + 12]}" + (
        ", changed since" if changed else ", unchanged" if changed is False else "") + ")"


def output_query(plan: Plan, ck: Any) -> Plan:
    """What made the checkpoint: for a plan with recursive steps, its output query (each
    step a source of its loop's internal topic, named as the checkpoint's offsets name it;
    the loops' own state is compared in plain Python, compat.recursive_state)."""
    from compat.steps import Recursive
    from migrate.build.recursive import has_recursion, rewritten

    if not has_recursion(plan):
        return plan
    offsets = ck.source_offsets()
    topics = {}
    for nid in plan.nodes:
        lp = ck.loops.get(nid)
        if isinstance(plan.nodes[nid], Recursive):
            topics[nid] = lp.topic if lp is not None and lp.topic else \
                f"theseus.recursive.{plan.query}.{nid}.new"
    parts = {t: len(offsets[t]) for t in topics.values() if t in offsets}
    return rewritten(plan, topics, max(parts.values(), default=plan.state_partitions or 1))


def dry_run_form(ck: Any, plan: Plan) -> str:
    """``job`` when Spark's Kafka connector wrote the checkpoint (a PySpark job's) and the
    plan can be written as one: the restart is the job's, whose state holds the job's
    columns; else ``theseus`` (the builders of ``theseus run``)."""
    from compat.export import exportable

    if ck.written_by == "kafka-connector" and exportable(plan) is None:
        return "job"
    return "theseus"


def check_checkpoint(checkpoint: str | None, new_path: str, *, query: str | None = None,
                     state: str | None = None, require: list[str] | None = None,
                     schema_compat: str = "forward", allow_migration: bool = False,
                     spark: Any = None) -> Report:
    # Step 1. The new plan.
    new = load_plan(new_path)
    recorded: Plan | None = None
    made_from = ""
    if query is not None:
        checkpoint, recorded = locate(state or ".theseus", query)
        made_from = recorded_from(state or ".theseus", query)
        if recorded is not None and recorded.query != new.query:
            raise CheckpointError("the new plan is of another query", file=new_path,
                                  pointer="/query", expected=repr(query),
                                  found=repr(new.query))
    assert checkpoint is not None
    # Step 2. The checkpoint, before any Spark.
    ck = read_checkpoint(checkpoint)
    # Step 3. Spark's view of the plans' operators.
    from migrate.stateops import plan_operators

    new_ops = plan_operators(output_query(new, ck), spark,
                             shuffle_partitions=ck.shuffle_partitions, conf=ck.conf,
                             form=dry_run_form(ck, new))
    rec_ops = plan_operators(output_query(recorded, ck), spark,
                             shuffle_partitions=ck.shuffle_partitions, conf=ck.conf,
                             form=dry_run_form(ck, recorded)) if recorded is not None else None
    # Steps 4 to 6: plain Python (compat.checkpoint_check).
    return checkpoint_report(ck, new, new_ops, recorded, rec_ops, require=require,
                             schema_compat=schema_compat, allow_migration=allow_migration,
                             recorded_from=made_from)
