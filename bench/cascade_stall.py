"""Benchmark part of ``make bench-migrate`` (``BENCH_PARTS=cascade``): the stall of a
two-query cascade, end to end.

The chain: an enrichment (source -> project -> topic T) feeding an aggregate per key (T ->
sum -> keyed update output O, one partition, so its records are in write order).  Both
change together (``theseus migrate start UP.json DOWN.json``): the upstream adds ``w``, the
downstream sums it too.  ``BENCH_CASCADE_KEYS`` keys get one record of history each; during
the migration a feeder writes ``BENCH_RATE`` records/s to 100 hot keys.  The downstream does
not reconcile (``--reconcile off``): this measures the chain's hand-over alone.

* **stall end to end** — from the old chain's last row in O to the new chain's first row in
  O (Kafka timestamps); target: at most two trigger intervals;
* **upstream stall** — in T, from the old upstream's last record before the propagated
  control events to the new upstream's first record after them;
* **oracle** — every row of O from the new chain has ``ws == 10 * s`` (the new downstream
  over the new upstream over all history) and the last row per key is the new chain over
  all input;
* **where the stall goes** (``breakdown_seconds``) — the moments of the hand-over, in
  seconds after the old upstream's last record in T: Kafka timestamps of the records in T
  and O, and the migrator's own (the phases and marks in each migration's ``history``:
  when it saw the old upstream at the cut, capped the old downstream, saw the upstream
  shadow at the cut and wrote the downstream shadow's switch, saw the old downstream
  read its cap, released the new upstream).  A moment the migrator does not mark (an
  older theseus) is taken from the phase it starts, and says so.  Each run is also
  appended to ``bench/results/cascade_runs.jsonl`` with the commit it measured.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
THESEUS = [sys.executable, "-m", "migrate.cli"]
KEYS = int(os.environ.get("BENCH_CASCADE_KEYS", "10000"))
TRIGGER_S = 1.0


def cascade_part(bs: str) -> dict:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import reconcile_stall
    from confluent_kafka.admin import AdminClient, NewTopic
    from reconcile_stall import Feeder, history, read, wait

    from gates.broker import watermarks
    from gates.control import is_control
    from gates.state import is_acked
    from migrate import migration
    from migrate.store import DirectoryStore

    # the chain's plans are the oracle test's own
    from tests.integration.test_cascade import down_plan, up_plan

    reconcile_stall.KEYS = KEYS  # the history: one record per key
    tag = uuid.uuid4().hex[:8]
    src, mid, out = f"bench-cas-in-{tag}", f"bench-cas-mid-{tag}", f"bench-cas-out-{tag}"
    admin = AdminClient({"bootstrap.servers": bs})
    fs = admin.create_topics([NewTopic(src, 3, 1), NewTopic(mid, 2, 1),
                              NewTopic(out, 1, 1, config={"cleanup.policy": "compact"})])
    for f in fs.values():
        f.result(30)
    work = ROOT / ".cache" / "bench" / f"cascade-{time.strftime('%H%M%S')}"
    state = work / "state"
    state.mkdir(parents=True, exist_ok=True)
    up, down = f"cu_{tag}", f"cd_{tag}"
    paths = {}
    for name, doc in (("up_v1", up_plan(up, src, mid, False)),
                      ("up_v2", up_plan(up, src, mid, True)),
                      ("down_v1", down_plan(down, mid, out, False)),
                      ("down_v2", down_plan(down, mid, out, True))):
        paths[name] = work / f"{name}.json"
        paths[name].write_text(json.dumps(doc))
    history(bs, src)
    olds = []
    for name in ("up_v1", "down_v1"):
        log = open(work / f"{name}.log", "ab")
        olds.append(subprocess.Popen(THESEUS + ["run", str(paths[name]), "--bootstrap", bs,
                                                "--state", str(state)], cwd=ROOT, stdout=log,
                                     stderr=subprocess.STDOUT))
    store = DirectoryStore(state)
    feeder = Feeder(bs, src)
    try:
        high = watermarks(bs, [src])
        wait(lambda: is_acked(state, up, high), 900, "the old upstream processes the history")
        wait(lambda: is_acked(state, down, watermarks(bs, [mid])), 900,
             "the old downstream processes the history")
        feeder.start()
        time.sleep(5)
        t0 = time.time()
        r = subprocess.run(THESEUS + ["migrate", "start", str(paths["up_v2"]),
                                      str(paths["down_v2"]), "--bootstrap", bs, "--state",
                                      str(state), "--timeout", "1500", "--reconcile", "off"],
                           cwd=ROOT, capture_output=True, text=True,
                           env=dict(os.environ, THESEUS_PLAIN_PROGRESS="1"))
        took = time.time() - t0
        (work / "migrate.log").write_text(r.stdout + r.stderr)
        if r.returncode != 0:
            subprocess.run(THESEUS + ["migrate", "abort", up, "--state", str(state)],
                           cwd=ROOT, capture_output=True)
            for p in olds:
                p.terminate()
            raise SystemExit("cascade failed:\n" + r.stdout + r.stderr)
        time.sleep(5)
    except BaseException:
        for p in olds:
            if p.poll() is None:
                p.terminate()
        raise
    finally:
        feeder.halt.set()
        feeder.join(60)
    m_up, m_down = migration.current(store, up), migration.current(store, down)
    a1, b1 = store.live_instance(up), store.live_instance(down)
    wait(lambda: is_acked(state, a1, watermarks(bs, [src])), 600, "the new upstream drains")
    wait(lambda: is_acked(state, b1, watermarks(bs, [mid])), 600, "the new downstream drains")
    for q, inst in ((up, a1), (down, b1)):
        subprocess.run(THESEUS + ["stop", q, "--state", str(state)], cwd=ROOT,
                       capture_output=True)
        wait(lambda inst=inst: store.status(inst).get("status") == "stopped", 300,
             f"{inst} stops")
    for p in olds:
        p.wait(60)
    rows = [r for r in read(bs, out) if not is_control(r[4])]
    first_new = next(i for i, r in enumerate(rows) if b'"ws"' in r[3])
    stall = (rows[first_new][1] - max(r[1] for r in rows[:first_new])) / 1000
    # the upstream's stall in T, around the propagated control events
    cut_t = {int(p): o for p, o in m_up.out_cut[mid].items()}
    from confluent_kafka import Consumer, TopicPartition

    before_ms, after_ms, control_ms = [], [], []
    c = Consumer({"bootstrap.servers": bs, "group.id": f"bench-{tag}",
                  "isolation.level": "read_committed", "enable.auto.commit": False})
    for p, o in cut_t.items():
        c.assign([TopicPartition(mid, p, max(0, o - 200))])
        got = 0
        deadline = time.monotonic() + 60
        while got < 400 and time.monotonic() < deadline:
            for msg in c.consume(500, timeout=1.0):
                if msg.error():
                    continue
                if is_control(msg.headers()):
                    if msg.offset() == o:  # the propagated cut's own control event
                        control_ms.append(msg.timestamp()[1])
                    continue
                got += 1
                (before_ms if msg.offset() < o else after_ms).append(
                    (msg.offset(), msg.timestamp()[1]))
    c.close()
    up_stall = (min(t for _o, t in after_ms) - max(t for _o, t in before_ms)) / 1000 \
        if before_ms and after_ms else None
    # the oracle
    total: dict = {}
    for _o, _ts, _k, v, h in read(bs, src):
        if v is None or is_control(h):
            continue
        d = json.loads(v)
        total[d["k"]] = total.get(d["k"], 0) + d["x"]
    last: dict = {}
    bad_ws = 0
    for _o, _ts, _k, v, _h in rows[first_new:]:
        d = json.loads(v)
        bad_ws += d.get("ws") != 10 * d["s"]
        last[d["k"]] = d
    wrong = [k for k, d in last.items() if d["s"] != total[k]]
    moments = breakdown(m_up.history, m_down.history,
                        old_up_last=max((t for _o, t in before_ms), default=None),
                        control=min(control_ms, default=None),
                        new_up_first=min((t for _o, t in after_ms), default=None),
                        old_down_last=max(r[1] for r in rows[:first_new]),
                        new_down_first=rows[first_new][1])
    out = {"keys": KEYS, "input_rate_per_s": reconcile_stall.RATE,
           "trigger_seconds": TRIGGER_S, "migration_seconds": round(took, 1),
           "stall_end_to_end_seconds": round(stall, 2),
           "stall_end_to_end_trigger_intervals": round(stall / TRIGGER_S, 2),
           "upstream_stall_seconds": None if up_stall is None else round(up_stall, 2),
           "target": "the chain's stall at most 2 trigger intervals end to end",
           "breakdown_seconds": moments,
           "new_rows_without_the_new_upstream_column": bad_ws,
           "keys_written_after_the_cut_not_the_new_chain_over_all_input": len(wrong),
           "cut": m_up.cut, "propagated_cut": m_up.out_cut,
           "downstream_phase": m_down.phase}
    log_run(out)
    return out


#: the moments of the hand-over: (name, migration, mark, phase entered when unmarked)
MOMENTS = (
    ("migrator saw the old upstream at the cut", "up", "old_at_cut", "propagate"),
    ("old downstream capped at the propagated cut", "down", "capped", "cut"),
    ("upstream shadow at the cut: downstream shadow's switch written", "down", "switch",
     None),
    ("old downstream read its cap", "down", "seen", "align"),
    ("new upstream released", "up", "opened", "cutover"),
)


def first_at(history: list, name: str) -> float | None:
    return next((float(t) for n, t in history if n == name), None)


def breakdown(up_history: list, down_history: list, *, old_up_last: int | None,
              control: int | None, new_up_first: int | None, old_down_last: int,
              new_down_first: int) -> dict[str, float | None]:
    """The moments of the chain's hand-over in seconds after the old upstream's last record
    in T (Kafka timestamps in ms; the migrator's history in unix seconds, same clock)."""
    if old_up_last is None:
        return {}
    t0 = old_up_last / 1000

    def rel(t: float | None) -> float | None:
        return None if t is None else round(t - t0, 2)

    out: dict[str, float | None] = {"old upstream's last record in T": 0.0}
    hist = {"up": up_history, "down": down_history}
    for name, who, mark, phase in MOMENTS:
        t = first_at(hist[who], mark)
        if t is None and phase is not None:
            t = first_at(hist[who], phase)
            name += f" (unmarked: {who}stream phase '{phase}' entered)"
        out[name] = rel(t)
    out["control events in T"] = rel(None if control is None else control / 1000)
    out["new upstream's first record in T"] = rel(
        None if new_up_first is None else new_up_first / 1000)
    out["old downstream's last row in O"] = rel(old_down_last / 1000)
    out["new downstream's first row in O"] = rel(new_down_first / 1000)
    return dict(sorted(out.items(), key=lambda kv: (kv[1] is None, kv[1] or 0)))


def log_run(result: dict) -> None:
    """Every run, appended with the commit it measured (the stall varies from run to run:
    all of them are kept, not the best)."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                cwd=ROOT, capture_output=True, text=True).stdout.strip())
    line = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "commit": commit + ("+changes" if dirty else ""),
            **{k: result[k] for k in ("stall_end_to_end_seconds", "upstream_stall_seconds",
                                      "breakdown_seconds",
                                      "new_rows_without_the_new_upstream_column",
                                      "keys_written_after_the_cut_not_the_new_chain_over_"
                                      "all_input")}}
    path = ROOT / "bench" / "results" / "cascade_runs.jsonl"
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "bench"))
    from migrate.run import spark_env
    from scripts.ship_story import bootstrap

    spark_env()
    print(json.dumps(cascade_part(bootstrap()), indent=2))
