"""A live migration on Avro topics with a real schema registry, Kafka and Spark.

The old plan reads and writes Avro in the registry's wire format and runs under
`theseus run`; `theseus migrate start` moves it to a new plan whose output adds a field with a
default.  The producer of the input evolves its schema exactly at the cut: every record
before it is written with writer schema 1, every record from it on with writer schema 2 (the
migrator is killed after the cut is recorded, the producer switches, the migration resumes).
Asserted: the output is the old plan over the input before the cut and the new plan over the
input after it (nothing lost, nothing twice); the new output schema is the subject's next
version before the shadow writes anything, and the output's wire prefix switches from the
old id to the new one at the cut; a plain Avro consumer with the old schemas reads every
record of both topics that is not a control event, and control events carry no body."""

from __future__ import annotations

import io
import json
import os
import time
from collections import Counter

import pytest

from tests.integration.test_avro_registry import schema_registry  # noqa: F401 - a fixture
from tests.integration.test_migration import (
    Feeder,
    drain_and_stop,
    spawn_run,
    theseus,
    wait_caught_up,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.own_jvm]


def record(name: str, *fields: dict) -> str:
    return json.dumps({"type": "record", "name": name, "namespace": "shop",
                       "fields": list(fields)})


# the producer's schema evolves at the cut: a nullable note with a default
W1 = record("Event", {"name": "id", "type": "long"}, {"name": "v", "type": "string"})
W2 = record("Event", {"name": "id", "type": "long"}, {"name": "v", "type": "string"},
            {"name": "note", "type": ["null", "string"], "default": None})
# the input's keys are Avro too (avro.key): a record of the key column
KEY = record("EventKey", {"name": "id", "type": "long"})


def plan(query: str, src: str, out: str, new: bool) -> dict:
    cols = [{"name": "id", "type": "bigint", "nullable": False},
            {"name": "v", "type": "string", "nullable": False}]
    shape = [{"name": "id", "expr": "id"},
             {"name": "v", "expr": "upper(v)" if new else "v"},
             {"name": "tag", "expr": "'new'" if new else "'old'"}]
    if new:
        # read W2's note (null from W1's records: the reader's default) and write it out:
        # the output's derived schema gets a field ["null", "string"] with default null
        cols.append({"name": "note", "type": "string"})
        shape.append({"name": "note", "expr": "note"})
    return {
        "format": "theseus.plan/1", "query": query, "config": {"state_partitions": 2},
        "nodes": [
            {"id": "events", "step": "source", "version": 1, "topic": src, "partitions": 3,
             "format": "avro", "avro": {"record": "shop.Event", "key": True},
             "role": "stream", "key_columns": ["id"], "schema": cols},
            {"id": "shape", "step": "project", "version": 1, "inputs": ["events"],
             "columns": shape},
            {"id": "out", "step": "sink", "version": 1, "inputs": ["shape"], "topic": out,
             "format": "avro", "avro": {"record": "shop.Out"}, "key_columns": [],
             "mode": "append", "delivery": "exactly_once"}]}


class AvroFeeder(Feeder):
    """Produces events at a steady rate in the wire format of ``encoder`` (swappable)."""

    def __init__(self, bootstrap: str, topic: str, encoder, keys, start: int = 0) -> None:
        super().__init__(bootstrap, topic)
        self.encoder, self.keys = encoder, keys
        self.n = start

    def run(self) -> None:
        while not self.halt.is_set():
            for _ in range(max(1, self.rate // 10)):
                doc = {"id": self.n, "v": f"x{self.n}"}
                if "note" in self.encoder.text:
                    doc["note"] = f"n{self.n}" if self.n % 2 else None
                self.p.produce(self.topic, self.encoder.encode(doc),
                               self.keys.encode({"id": self.n}), partition=self.n % 3)
                self.n += 1
            self.p.poll(0)
            time.sleep(0.1)
        self.p.flush(30)


class PlainConsumer:
    """What a consumer deployed before the migration does: the writer schema by the id in
    the prefix, resolved against its own reader schema, with fastavro alone (not
    gates.avro, the code under test)."""

    def __init__(self, client, reader: str) -> None:
        import fastavro

        self.fastavro, self.client = fastavro, client
        self.reader = fastavro.parse_schema(json.loads(reader))
        self.writers: dict[int, object] = {}

    def read(self, value: bytes) -> tuple[int, dict]:
        assert value[0] == 0, f"no magic byte: {value[:5].hex()}"
        sid = int.from_bytes(value[1:5], "big")
        if sid not in self.writers:
            self.writers[sid] = self.fastavro.parse_schema(json.loads(self.client.schema(sid)))
        body = io.BytesIO(value[5:])
        doc = self.fastavro.schemaless_reader(body, self.writers[sid], self.reader)
        assert body.tell() == len(value) - 5
        return sid, doc


def subject_ids(client, subject: str) -> list[int]:
    """The schema ids of the subject's versions, in version order."""
    versions = client._request("GET", f"/subjects/{subject}/versions")
    return [int(client._request("GET", f"/subjects/{subject}/versions/{v}")["id"])
            for v in sorted(versions)]


def test_live_migration_on_avro_topics_is_exact_across_a_schema_evolution(
        kafka, schema_registry, tmp_path, monkeypatch):  # noqa: F811 - the fixture
    from compat import avro as A
    from compat.infer import analyze
    from compat.registry import RegistryClient
    from compat.serde import from_doc
    from compat.steps.sink import avro_schema
    from gates.avro import AvroEncoder
    from gates.control import is_control
    from migrate import migration
    from migrate.store import DirectoryStore

    monkeypatch.setenv("SCHEMA_REGISTRY_URL", schema_registry)  # every theseus spawned
    client = RegistryClient(schema_registry)
    src = kafka.topic(prefix="avmig-in", partitions=3)
    out = kafka.topic(prefix="avmig-out", partitions=1)
    state, query = tmp_path / "state", f"av{tmp_path.name[-6:]}".replace("-", "_")
    old_p, new_p = tmp_path / "v1.json", tmp_path / "v2.json"
    old_doc, new_doc = plan(query, src, out, False), plan(query, src, out, True)
    old_p.write_text(json.dumps(old_doc))
    new_p.write_text(json.dumps(new_doc))
    out_schemas = []
    for doc in (old_doc, new_doc):
        p = from_doc(doc)
        analyze(p)
        out_schemas.append(A.canonical(avro_schema(p.sink, p.info[p.sink.id])))
    w1 = AvroEncoder(f"{src}-value", W1, client)
    w2 = AvroEncoder(f"{src}-value", W2, client)
    keys = AvroEncoder(f"{src}-key", KEY, client)

    feeder = AvroFeeder(kafka.bootstrap, src, w1, keys)
    feeder.start()
    old = spawn_run(old_p, kafka.bootstrap, state)
    store = DirectoryStore(state)
    t0 = time.monotonic()
    try:
        wait_for(lambda: store.status(query).get("status") == "running", 180, "old query up")
        wait_caught_up(kafka, state, store.live_instance(query), src)  # rows before the cut
        args = ["--state", str(state), "--timeout", "300"]
        # killed on entering the pause: the shadow runs (its start gate closed)
        r = theseus("migrate", "start", str(new_p), "--bootstrap", kafka.bootstrap,
                    "--strategy", "shadow", *args, timeout=400,
                    env=dict(os.environ, THESEUS_FAULT="after:pause"))
        assert r.returncode == -9, r.stdout + r.stderr
        m = migration.current(store, query)
        assert m.phase == "pause" and store.status(m.new_instance).get("status") == "running"
        # the shadow registered the new schema as the subject's next version when it
        # started, and nothing in the output carries it yet
        old_id, new_id = subject_ids(client, f"{out}-value")
        assert json.loads(client.schema(new_id)) == json.loads(out_schemas[1])
        written = [r for r in kafka.read_all(out) if not is_control(r.headers)]
        assert written and {int.from_bytes(r.value[1:5], "big") for r in written} == {old_id}

        # the producer pauses so that the cut falls at the end of its schema-1 records
        feeder.stop()
        r = theseus("migrate", "resume", query, *args, timeout=400,
                    env=dict(os.environ, THESEUS_FAULT="after:align"))
        assert r.returncode == -9, r.stdout + r.stderr
        cut = migration.current(store, query).cut[src]
        feeder = AvroFeeder(kafka.bootstrap, src, w2, keys, start=feeder.n)
        feeder.start()
        r = theseus("migrate", "resume", query, *args, timeout=400)
        assert r.returncode == 0, r.stdout + r.stderr
        m = migration.current(store, query)
        assert m.phase == "done" and m.cut[src] == cut
        # drain_and_stop's handle on the input and the old query's process
        from types import SimpleNamespace

        drain_and_stop(kafka, SimpleNamespace(store=store, query=query, state=state,
                                              src=src, feeder=feeder, old=old))
    finally:
        feeder.stop()
        if old.poll() is None:
            old.kill()
    print(f"\nAvro live migration: {time.monotonic() - t0:.1f} s, cut {cut}")

    # the input: schema 1 exactly before the cut, schema 2 from it on
    raw_in = kafka.read_all(src)
    inputs = [r for r in raw_in if not is_control(r.headers)]
    ids_before = {int.from_bytes(r.value[1:5], "big") for r in inputs
                  if r.offset < cut[str(r.partition)]}
    ids_after = {int.from_bytes(r.value[1:5], "big") for r in inputs
                 if r.offset >= cut[str(r.partition)]}
    assert (ids_before, ids_after) == ({w1.schema_id}, {w2.schema_id})

    # old consumers, with the schemas from before the migration, read every record that
    # is not a control event; control events are a header and a null value
    old_in, old_out = PlainConsumer(client, W1), PlainConsumer(client, out_schemas[0])
    raw_out = kafka.read_all(out)
    controls = [r for r in raw_in + raw_out if is_control(r.headers)]
    assert controls and all(r.value is None for r in controls)
    for r in inputs:
        old_in.read(r.value)
    # ... and their key deserializers read every key: the control events' keys are null
    # on the input, whose keys are Avro and which does not compact (a null key is what a
    # registry deserializer hands on for no bytes), the others decode with the key schema
    in_controls = [r for r in raw_in if is_control(r.headers)]
    assert len(in_controls) == 3 and all(r.key is None for r in in_controls)
    old_keys = PlainConsumer(client, KEY)
    assert all(old_keys.read(r.key)[1] == {"id": old_in.read(r.value)[1]["id"]}
               for r in inputs)
    rows = [old_out.read(r.value) for r in raw_out if not is_control(r.headers)]
    assert all(set(doc) == {"id", "v", "tag"} for _, doc in rows)

    # the output's wire prefix: the old version's id up to the cut, the new one's after
    sids = [sid for sid, _ in rows]
    switch = sids.index(new_id)
    assert 0 < switch and sids == [old_id] * switch + [new_id] * (len(sids) - switch)

    # exact: the old plan before the cut, the new plan (schema 2's note) from it on
    in_reader = PlainConsumer(client, W2)
    want: Counter = Counter()
    for r in inputs:
        _, d = in_reader.read(r.value)
        if r.offset < cut[str(r.partition)]:
            row = {"id": d["id"], "v": d["v"], "tag": "old"}
        else:
            row = {"id": d["id"], "v": d["v"].upper(), "tag": "new", "note": d["note"]}
        want[json.dumps(row, sort_keys=True)] += 1
    writer = PlainConsumer(client, out_schemas[1])
    got: Counter = Counter()
    for r in raw_out:
        if not is_control(r.headers):
            sid, d = writer.read(r.value)
            if sid == old_id:
                d.pop("note")  # the new reader's default: the old rows have no note
            got[json.dumps(d, sort_keys=True)] += 1
    assert sum(want.values()) > 100
    assert got == want, (f"missing {sum((want - got).values())}, "
                         f"extra {sum((got - want).values())}")
    assert any(json.loads(k).get("note") for k in got)
