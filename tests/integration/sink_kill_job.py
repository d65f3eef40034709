"""A small streaming job for the crash test: gated source → project → exactly-once sink.

    python sink_kill_job.py --bootstrap B --input T --output O --checkpoint DIR --query Q
        [--hold in_txn|after_commit --hold-from N --signal-dir DIR] [--max-records 200]

With ``--hold``, once the sink reaches batch >= N it writes ``<signal-dir>/<hold>-<batch>``
and sleeps (inside the open transaction, or after the transaction committed but before Spark
records the batch as done) until the test SIGKILLs the whole process group.
Without it, the job runs with trigger(availableNow=True) to the end and exits 0.
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
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--query", required=True)
    ap.add_argument("--hold", choices=["in_txn", "after_commit"])
    ap.add_argument("--hold-from", type=int, default=0)
    ap.add_argument("--signal-dir")
    ap.add_argument("--max-records", type=int, default=400)
    ap.add_argument("--timeout", type=float, default=300)
    a = ap.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from gates.sink import make_writer
    from gates.source import register

    spark = (SparkSession.builder.master("local[2]").appName("theseus-kill-job")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)

    def hold(phase):
        def fn(batch_id: int) -> None:
            if a.hold == phase and batch_id >= a.hold_from:
                Path(a.signal_dir, f"{phase}-{batch_id}").write_text(str(os.getpid()))
                print(f"job: holding in {phase} at batch {batch_id}", file=sys.stderr, flush=True)
                time.sleep(3600)  # until killed
        return fn

    writer = make_writer(a.bootstrap, a.output, ["id"], a.query, "exactly_once",
                         hooks={"before_commit": hold("in_txn"),
                                "after_commit": hold("after_commit")})
    df = (spark.readStream.format("theseus_kafka")
          .option("bootstrap", a.bootstrap).option("topic", a.input).option("partitions", 3)
          .option("format", "json").option("schema", "id BIGINT, payload STRING")
          .option("maxRecordsPerBatch", a.max_records).load())
    out = df.select("id", F.upper("payload").alias("payload"))

    def fb(batch_df, batch_id):
        writer(batch_df, batch_id)
        s = writer.last_stats
        print(f"job: batch {batch_id} rows={s.get('rows')} skipped={s.get('skipped')}",
              file=sys.stderr, flush=True)

    q = (out.writeStream.foreachBatch(fb).option("checkpointLocation", a.checkpoint)
         .trigger(availableNow=True).start())
    done = q.awaitTermination(a.timeout)
    writer.close()
    if not done:
        q.stop()
        print("job: timed out", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
