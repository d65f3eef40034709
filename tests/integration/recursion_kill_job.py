"""A recursive plan for the crash test: the descendants/closure plan run with available-now.

    python recursion_kill_job.py --bootstrap B --plan PLAN.json --checkpoint DIR --query Q
        [--hold in_txn|after_commit --hold-from N --signal-dir DIR] [--max-records 8]

With ``--hold``, once the loop query's sink reaches batch >= N (its state for the batch is
written) it writes ``<signal-dir>/<hold>-<batch>`` and sleeps — inside the open transaction, or
after it committed but before Spark records the batch — until the test SIGKILLs the process
group.  Without it, the plan runs to the end and the job exits 0.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--plan", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--query", required=True)
    ap.add_argument("--hold", choices=["in_txn", "after_commit"])
    ap.add_argument("--hold-from", type=int, default=0)
    ap.add_argument("--signal-dir")
    ap.add_argument("--max-records", type=int, default=8)
    a = ap.parse_args()

    import gates.sink
    from compat.check import load_plan
    from migrate.build import Builder, BuildOptions
    from migrate.run import spark_session

    def hold(phase):
        def fn(batch_id: int) -> None:
            if a.hold == phase and batch_id >= a.hold_from:
                Path(a.signal_dir, f"{phase}-{batch_id}").write_text(str(os.getpid()))
                print(f"job: holding in {phase} at batch {batch_id}", file=sys.stderr,
                      flush=True)
                time.sleep(3600)  # until killed
        return fn

    plain = gates.sink.make_writer

    def make_writer(bootstrap, topic, *args, **kw):
        if topic.startswith("theseus.recursive."):  # the loop query's sink
            kw["hooks"] = {"before_commit": hold("in_txn"),
                           "after_commit": hold("after_commit")}
        return plain(bootstrap, topic, *args, **kw)

    gates.sink.make_writer = make_writer
    plan = load_plan(a.plan)
    spark = spark_session("local[2]", plan.state_partitions or 2)
    opts = BuildOptions(bootstrap=a.bootstrap, query=a.query, available_now=True,
                        checkpoint=a.checkpoint, max_records_per_batch=a.max_records)
    chain = Builder(spark, plan, opts).start()
    done = chain.awaitTermination(300)
    for line in chain.notes():
        print("job:", line.strip(), file=sys.stderr, flush=True)
    if not done or chain.exception() is not None:
        print(f"job: failed {chain.exception()}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
