"""`make demo`, part 2: the ship-load example on real Kafka and real Spark.

Starts (or reuses) the local broker, produces ships (a table) and packages (a stream),
runs the plan with `theseus run --available-now`, and prints the alerts it wrote.
Topic names get a per-run suffix so that demos never mix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHIPS = {"s1": 100.0, "s2": 50.0, "s3": 10.0, "s4": 80.0}
PACKAGES = [("s1", 40.0), ("s1", 55.0), ("s2", 20.0), ("s3", 9.5), ("s4", 30.0),
            ("s4", 45.0), ("s2", 12.5), ("s9", 1.0)]


def bootstrap() -> str:
    if os.environ.get("KAFKA_BOOTSTRAP"):
        return os.environ["KAFKA_BOOTSTRAP"]
    out = subprocess.run(["bash", str(ROOT / "scripts" / "kafka.sh"), "start"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.stderr.write(out.stderr)
        raise SystemExit("could not start Kafka")
    return out.stdout.strip().splitlines()[-1].split("=", 1)[1]


def main() -> int:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    print("\n== the ship-load query on real Kafka and Spark ==")
    bs = bootstrap()
    print(f"Kafka at {bs}")
    run_id = time.strftime("%H%M%S")
    work = ROOT / ".cache" / "demo" / run_id
    work.mkdir(parents=True, exist_ok=True)
    doc = json.loads((ROOT / "fixtures" / "plans" / "ship_load.json").read_text())
    topics = {}
    for n in doc["nodes"]:
        if "topic" in n:
            topics[n["topic"]] = n["topic"] = f"demo{run_id}-{n['topic']}"
    plan_path = work / "ship_load.json"
    plan_path.write_text(json.dumps(doc, indent=2))
    admin = AdminClient({"bootstrap.servers": bs})
    futs = admin.create_topics([NewTopic(topics["packages"], 3, 1),
                                NewTopic(topics["ships"], 1, 1),
                                NewTopic(topics["ship_alerts"], 3, 1)])
    for f in futs.values():
        f.result(30)
    p = Producer({"bootstrap.servers": bs})
    for ship, cap in SHIPS.items():
        p.produce(topics["ships"], key=json.dumps({"ship_id": ship}),
                  value=json.dumps({"ship_id": ship, "capacity": cap}))
    for i, (ship, w) in enumerate(PACKAGES):
        p.produce(topics["packages"], key=json.dumps({"ship_id": ship}),
                  value=json.dumps({"ship_id": ship, "weight": w,
                                    "ts": f"2026-01-01T10:00:{i:02d}Z"}))
    p.flush(30)
    print(f"produced {len(SHIPS)} ships and {len(PACKAGES)} packages")
    cmd = [sys.executable, "-m", "migrate.cli", "run", str(plan_path), "--bootstrap", bs,
           "--state", str(work / "state"), "--available-now"]
    print("$ theseus " + " ".join(cmd[3:]))
    rc = subprocess.run(cmd, cwd=ROOT).returncode
    if rc != 0:
        print(f"theseus run failed with exit {rc}")
        return rc
    c = Consumer({"bootstrap.servers": bs, "group.id": f"demo-{run_id}",
                  "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                  "enable.partition.eof": True})
    c.assign([TopicPartition(topics["ship_alerts"], i, 0) for i in range(3)])
    latest: dict[str, object] = {}
    eof = set()
    deadline = time.time() + 30
    while len(eof) < 3 and time.time() < deadline:
        m = c.poll(1.0)
        if m is None:
            continue
        if m.error():
            eof.add(m.partition())
            continue
        latest[m.key().decode()] = json.loads(m.value()) if m.value() else None
    c.close()
    print("alerts (ships loaded beyond 90% of capacity):")
    alerts = {k: v for k, v in latest.items() if v is not None}
    for v in sorted(alerts.values(), key=lambda v: v["ship_id"]):
        print(f"  {v['ship_id']}: load {v['load']} of capacity {v['capacity']}")
    expected = {"s1", "s3", "s4"}
    got = {v["ship_id"] for v in alerts.values()}
    print("as expected" if got == expected else f"UNEXPECTED: {sorted(got)} != "
          f"{sorted(expected)}")
    return 0 if got == expected else 1


if __name__ == "__main__":
    sys.exit(main())
