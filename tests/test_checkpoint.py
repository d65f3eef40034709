"""Reading a Spark checkpoint in plain Python, and Spark's restart rules over it.

``fixtures/checkpoints/agg_dedup`` is a real checkpoint written by Spark 4.3 (RocksDB state
store) for ``plan.json`` beside it (a dedup under an aggregate, two batches), with its
state data files left out: only the logs, operator metadata and schema files, which are
what ``compat.checkpoint`` reads.  The rules are tested against Spark's own behaviour in
``tests/integration/test_checkpoint_truth.py``.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from dataclasses import replace

import pytest
from click.testing import CliRunner

from compat.check import load_plan
from compat.checkpoint import (
    CheckpointError,
    Operator,
    compatible,
    read_checkpoint,
    read_schema_file,
    type_string,
)
from compat.checkpoint_check import compare, drift, predict, stateful_nodes
from migrate import runner
from migrate.cli import main
from tests.conftest import FIXTURES, ROOT

CK = FIXTURES / "checkpoints" / "agg_dedup"


def test_reads_spark_checkpoint():
    ck = read_checkpoint(CK)
    assert ck.query_id == "aac996b2-e3cb-431e-9a79-d20a6f019ff2"
    assert ck.last_committed == 1
    assert ck.shuffle_partitions == 3
    assert ck.source_offsets() == {"probe-17759073": {"0": 10, "1": 10}}
    assert [(op.id, op.name, op.partitions) for op in ck.operators] == \
        [(0, "stateStoreSave", 3), (1, "dedupe", 3)]
    agg, dedup = ck.operators
    assert type_string(agg.stores[0].key_schema) == "struct<k:string>"
    assert type_string(agg.stores[0].value_schema) == "struct<sum:bigint,count:bigint>"
    assert type_string(dedup.stores[0].key_schema) == "struct<k:string,v:int>"
    assert ck.not_verified == []


def _utf(s: str) -> bytes:
    b = s.encode()
    return struct.pack(">H", len(b)) + b


def test_schema_file_v1_and_v2_round(tmp_path):
    key = {"type": "struct", "fields": [{"name": "a", "type": "long", "nullable": True,
                                         "metadata": {}}]}
    val = {"type": "struct", "fields": [{"name": "b", "type": "string", "nullable": False,
                                         "metadata": {}}]}
    v1 = tmp_path / "v1"
    v1.write_bytes(_utf("v1") + _utf(json.dumps(key)) + _utf(json.dumps(val)))
    assert read_schema_file(v1) == (key, val)
    # v2 splits each schema into chunks (Java's writeUTF takes 65535 bytes at most)
    kt, vt = json.dumps(key), json.dumps(val)
    v2 = tmp_path / "v2"
    v2.write_bytes(_utf("v2") + struct.pack(">i", 2) + _utf(kt[:10]) + _utf(kt[10:])
                   + struct.pack(">i", 1) + _utf(vt))
    assert read_schema_file(v2) == (key, val)
    bad = tmp_path / "bad"
    bad.write_bytes(_utf("v2") + struct.pack(">i", 3) + _utf(kt[:10]))
    with pytest.raises(CheckpointError, match="corrupted state schema file"):
        read_schema_file(bad)


def _chunked(text: str, size: int = 1 << 16) -> bytes:
    parts = [text[i:i + size] for i in range(0, len(text), size)] or [""]
    return struct.pack(">i", len(parts)) + b"".join(_utf(t) for t in parts)


def test_schema_file_v3_as_schema_v3_writer_writes_it(tmp_path):
    """SchemaHelper.SchemaV3Writer's layout (a real transformWithState checkpoint of
    PySpark 4.3 has it): writeUTF("v3"), an int count, per column family its name and
    four chunked JSON texts; the user key encoder schema "{    }" when none."""
    key = {"type": "struct", "fields": [{"name": "_theseus_key", "type": "string",
                                         "nullable": True, "metadata": {}}]}
    val = {"type": "struct", "fields": [{"name": "st", "type": "string", "nullable": True,
                                         "metadata": {}}]}
    spec = {"keyStateEncoderType": "NoPrefixKeyStateEncoderSpec"}
    kt = json.dumps(key)
    v3 = tmp_path / "0_uuid"
    v3.write_bytes(_utf("v3") + struct.pack(">i", 2)
                   + _utf("s") + struct.pack(">i", 2) + _utf(kt[:7]) + _utf(kt[7:])
                   + _chunked(json.dumps(val)) + _chunked(json.dumps(spec))
                   + _chunked("{    }")
                   + _utf("m") + _chunked(kt) + _chunked(json.dumps(val))
                   + _chunked(json.dumps(spec)) + _chunked(json.dumps(val)))
    got = read_schema_file(v3)
    assert [f["colFamilyName"] for f in got] == ["s", "m"]
    assert got[0]["keySchema"] == key and got[0]["valueSchema"] == val
    assert got[0]["keyStateEncoderSpec"] == spec and "userKeyEncoderSchema" not in got[0]
    assert got[1]["userKeyEncoderSchema"] == val
    cut = tmp_path / "cut"
    cut.write_bytes(v3.read_bytes()[:40])
    with pytest.raises(CheckpointError, match="corrupted state schema file"):
        read_schema_file(cut)
    # StateSchemaV3File's text form: a "v3" line, one JSON column family a line
    text = tmp_path / "text"
    text.write_text("v3\n" + json.dumps({"columnFamilyName": "s", "keySchema": kt,
                                          "valueSchema": json.dumps(val)}))
    (doc,) = read_schema_file(text)
    assert doc["keySchema"] == key and doc["valueSchema"] == val


def _s(*types, names=None, nullable=True):
    names = names or [f"f{i}" for i in range(len(types))]
    return {"type": "struct", "fields": [{"name": n, "type": t, "nullable": nullable,
                                          "metadata": {}} for n, t in zip(names, types)]}


def test_compatible_is_sparks_rule():
    assert compatible(_s("string", "long"), _s("string", "long", names=["x", "y"]))
    assert not compatible(_s("integer"), _s("long"))  # widening is not compatible in state
    assert not compatible(_s("string"), _s("string", "long"))
    # a nullable field may not be read as NOT NULL the other way round
    assert compatible(_s("string", nullable=True), _s("string", nullable=False))
    assert not compatible(_s("string", nullable=False), _s("string", nullable=True))
    nested = {"type": "struct", "fields": [{"name": "w", "type": _s("timestamp", "timestamp"),
                                            "nullable": True}]}
    assert compatible(nested, nested)


# -- the restart rules, over the real checkpoint and altered copies of its operators ------

def _plan():
    return load_plan(str(CK / "plan.json"))


def _new_ops(ops=None, offsets=None):
    ck = read_checkpoint(CK)
    ck.offsets = offsets if offsets is not None else [{"theseus_empty": "src"}]
    if ops is not None:
        ck.operators = ops
    return ck


def _codes(findings):
    return sorted(f.code for f in findings)


def test_same_operators_start():
    fs = compare(read_checkpoint(CK), _new_ops(), _plan())
    assert fs == []
    assert predict(fs).outcome == "starts"


def test_operator_added_fails_with_metadata_mismatch():
    ck = read_checkpoint(CK)
    extra = Operator(2, "dedupe", ck.operators[1].stores)
    fs = compare(ck, _new_ops(ck.operators + [extra]), _plan())
    assert _codes(fs) == ["checkpoint-operators-mismatch"]
    p = predict(fs)
    assert (p.outcome, p.error_class) == \
        ("fails", "STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA")


def _with_store(op, **kw):
    return replace(op, stores=(replace(op.stores[0], **kw),))


def test_key_type_changed_fails_and_renamed_key_is_wrong_state():
    ck = read_checkpoint(CK)
    agg, dedup = ck.operators
    wider = _with_store(agg, key_schema=_s("long", names=["k"]))
    fs = compare(ck, _new_ops([wider, dedup]), _plan())
    assert _codes(fs) == ["checkpoint-key-schema-incompatible"]
    assert predict(fs).error_class == "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE"
    other = _with_store(agg, key_schema=_s("string", names=["region"]))
    fs = compare(ck, _new_ops([other, dedup]), _plan())
    assert _codes(fs) == ["checkpoint-state-reinterpreted"]
    assert fs[0].new_node == "agg"  # operator 0 is the aggregate, matched in order
    assert predict(fs).outcome == "wrong_state"


def test_value_schema_changed_fails():
    ck = read_checkpoint(CK)
    agg, dedup = ck.operators
    more = _with_store(agg, value_schema=_s("long", "long", "double"))
    fs = compare(ck, _new_ops([more, dedup]), _plan())
    assert _codes(fs) == ["checkpoint-value-schema-incompatible"]
    assert predict(fs).error_class == "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE"


def test_sources_and_partitions():
    ck = read_checkpoint(CK)
    plan = _plan()
    fs = compare(ck, _new_ops(offsets=[{"theseus_empty": "src"}, {"theseus_empty": "src"}]),
                 plan)
    assert _codes(fs) == ["checkpoint-sources-changed"] and predict(fs).outcome == "fails"
    doc = json.loads((CK / "plan.json").read_text())
    doc["nodes"][0]["partitions"] = 4
    doc["nodes"][0]["topic"] = "other"
    doc["config"]["state_partitions"] = 8
    p2 = CK.parent / "_tmp_plan.json"
    try:
        p2.write_text(json.dumps(doc))
        fs = compare(ck, _new_ops(), load_plan(str(p2)))
    finally:
        p2.unlink()
    assert _codes(fs) == ["checkpoint-partitions-pinned", "checkpoint-source-topic-changed"]
    doc["nodes"][0]["topic"] = "probe-17759073"
    try:
        p2.write_text(json.dumps(doc))
        fs = compare(ck, _new_ops(), load_plan(str(p2)))
    finally:
        p2.unlink()
    assert _codes(fs) == ["checkpoint-partitions-pinned", "checkpoint-source-partitions-changed"]
    assert predict(fs).outcome == "starts"


def test_stateless_checkpoint_and_stateful_plan_fails_as_spark_4_does():
    # the truth corpus's upgrades/stateful_dedup_added (a dropDuplicates added to a stateless
    # query): Spark 4.3 refused the restart with this error class, where the rule had said
    # "starts with empty state"
    ck = read_checkpoint(CK)
    ck.operators = []
    fs = compare(ck, _new_ops(), _plan())
    assert _codes(fs) == ["checkpoint-state-missing"]
    p = predict(fs)
    assert (p.outcome, p.error_class) == \
        ("fails", "STREAMING_STATEFUL_OPERATOR_MISSING_STATE_DIRECTORY")


def test_drift_names_the_differences():
    ck = read_checkpoint(CK)
    agg, dedup = ck.operators
    rec = _new_ops([_with_store(agg, key_schema=_s("string", "string", names=["k", "g"]))])
    diffs = drift(ck, rec)
    assert any("operators [0: stateStoreSave, 1: dedupe]" in d for d in diffs)
    assert any("struct<k:string> in the checkpoint, struct<k:string,g:string>" in d
               for d in diffs)
    assert drift(ck, _new_ops()) == []


def test_operator_order_is_sparks():
    assert stateful_nodes(_plan()) == ["agg", "d"]


# -- bad input: one line, exit 2, no traceback, and Spark never started -------------------

def _check(*args):
    return CliRunner().invoke(main, ["check", *args])


@pytest.fixture()
def ck_copy(tmp_path):
    dst = tmp_path / "ck"
    shutil.copytree(CK, dst)
    return dst


@pytest.fixture()
def no_spark(monkeypatch):
    """Bad input must fail before the dry run: a Spark started here is a failure."""
    import migrate.stateops

    def refuse(*a, **kw):
        raise AssertionError("the dry run (Spark) started on bad input")

    monkeypatch.setattr(migrate.stateops, "plan_operators", refuse)


def _one_line_exit_2(r, *needles):
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.output, r.output
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def test_not_a_checkpoint(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    _one_line_exit_2(_check("--checkpoint", str(tmp_path), str(CK / "plan.json")),
                     "not a checkpoint directory", str(tmp_path), "notes.txt")
    _one_line_exit_2(_check("--checkpoint", str(tmp_path / "nope"), str(CK / "plan.json")),
                     "no such directory")


def test_no_committed_batch(ck_copy):
    shutil.rmtree(ck_copy / "commits")
    _one_line_exit_2(_check("--checkpoint", str(ck_copy), str(CK / "plan.json")),
                     "no committed batch", "2 batch(es) planned")


def test_corrupted_offsets(ck_copy):
    (ck_copy / "offsets" / "1").write_text('v1\n{"batchWatermarkMs":0,\n{"t": {"0": 1}}\n')
    line = _one_line_exit_2(_check("--checkpoint", str(ck_copy), str(CK / "plan.json")),
                            "corrupted offsets file", "offsets/1", "line 2")
    assert "expected JSON" in line
    (ck_copy / "offsets" / "1").write_bytes(b"\x00\x01garbage")
    _one_line_exit_2(_check("--checkpoint", str(ck_copy), str(CK / "plan.json")),
                     "corrupted offsets file", "'v1'")


_META = {"batchWatermarkMs": 0, "batchTimestampMs": 1,
         "conf": {"spark.sql.shuffle.partitions": "3"}}


@pytest.mark.parametrize("change,pointer,found", [
    ({"conf": "spark.sql.shuffle.partitions=3"}, "/conf", "str"),
    ({"conf": [["spark.sql.shuffle.partitions", "3"]]}, "/conf", "list"),
    ({"conf": {"spark.sql.shuffle.partitions": "three"}},
     "/conf/spark.sql.shuffle.partitions", "str \"three\""),
    ({"conf": {"spark.sql.shuffle.partitions": {"n": 3}}},
     "/conf/spark.sql.shuffle.partitions", "dict"),
    ({"batchWatermarkMs": "0"}, "/batchWatermarkMs", "str \"0\""),
    ({"batchWatermarkMs": True}, "/batchWatermarkMs", "bool"),
])
def test_corrupted_offsets_metadata(ck_copy, no_spark, change, pointer, found):
    """OffsetSeqMetadata of another shape than Spark writes: one error naming the file, the
    pointer, expected versus found (was an AttributeError, 'this is a bug')."""
    lines = (ck_copy / "offsets" / "1").read_text().split("\n")
    lines[1] = json.dumps(_META | change)
    (ck_copy / "offsets" / "1").write_text("\n".join(lines))
    line = _one_line_exit_2(_check("--checkpoint", str(ck_copy), str(CK / "plan.json")),
                            "corrupted offsets file", "offsets/1", f"at {pointer}",
                            f"found {found}")
    assert "internal error" not in line and "bug" not in line


_OP = {"operatorInfo": {"operatorId": 0, "operatorName": "stateStoreSave"},
       "stateStoreInfo": [{"storeName": "default", "numColsPrefixKey": 0, "numPartitions": 3}]}


@pytest.mark.parametrize("text,pointer,found", [
    ("v1\n{}", "/operatorInfo", "nothing"),
    ("v1\n[1]", "at /", "list [1]"),
    ("v1\n", "at /", "nothing"),
    ("v1\n" + json.dumps(_OP | {"operatorInfo": "stateStoreSave"}), "/operatorInfo",
     "str"),
    ("v1\n" + json.dumps(_OP | {"operatorInfo": {"operatorId": "0",
                                                 "operatorName": "stateStoreSave"}}),
     "/operatorInfo/operatorId", 'str "0"'),
    ("v1\n" + json.dumps(_OP | {"operatorInfo": {"operatorId": 5,
                                                 "operatorName": "stateStoreSave"}}),
     "/operatorInfo/operatorId", "int 5"),
    ("v1\n" + json.dumps(_OP | {"operatorInfo": {"operatorId": 0}}),
     "/operatorInfo/operatorName", "nothing"),
    ("v1\n" + json.dumps(_OP | {"stateStoreInfo": {"storeName": "default"}}),
     "/stateStoreInfo", "dict"),
    ("v1\n" + json.dumps(_OP | {"stateStoreInfo": ["default"]}), "/stateStoreInfo/0",
     "str"),
    ("v1\n" + json.dumps(_OP | {"stateStoreInfo": [{"storeName": "default",
                                                    "numColsPrefixKey": 0,
                                                    "numPartitions": "3"}]}),
     "/stateStoreInfo/0/numPartitions", 'str "3"'),
])
def test_corrupted_operator_metadata(ck_copy, no_spark, text, pointer, found):
    """Operator metadata of another shape than Spark's OperatorStateMetadataV1 is corrupted,
    said as such (was an operator named 'None' and a confident 'fails,
    STREAMING_STATEFUL_OPERATOR_NOT_MATCH...' prediction, or an AttributeError)."""
    (ck_copy / "state" / "0" / "_metadata" / "metadata").write_text(text)
    with pytest.raises(CheckpointError) as e:
        read_checkpoint(ck_copy)
    msg = str(e.value)
    assert "corrupted operator metadata (v1)" in msg and "state/0/_metadata/metadata" in msg
    assert pointer in msg and f"found {found}" in msg, msg
    line = _one_line_exit_2(_check("--checkpoint", str(ck_copy), str(CK / "plan.json")),
                            "corrupted operator metadata")
    assert "None" not in line and "bug" not in line


def test_corrupted_v2_operator_metadata(ck_copy, no_spark):
    op = ck_copy / "state" / "0" / "_metadata"
    (op / "v2").mkdir()
    store = {"storeName": "default", "numColsPrefixKey": 0, "numPartitions": 3,
             "stateSchemaFilePaths": "file:/x/_stateSchema/default/0_x"}
    (op / "v2" / "1").write_text("v2\n" + json.dumps({
        "operatorInfo": {"operatorId": 0, "operatorName": "transformWithStateExec"},
        "stateStoreInfo": [store], "operatorPropertiesJson": "{}"}))
    _one_line_exit_2(_check("--checkpoint", str(ck_copy), str(CK / "plan.json")),
                     "corrupted operator metadata (v2)", "v2/1",
                     "at /stateStoreInfo/0/stateSchemaFilePaths", "expected a list of paths")


@pytest.mark.parametrize("cut,found", [(0, "an empty file"), (1, "a file cut short (1 bytes)"),
                                       (30, "a file cut short (30 bytes)")])
def test_empty_or_truncated_schema_file(ck_copy, no_spark, cut, found):
    schema = ck_copy / "state" / "0" / "0" / "_metadata" / "schema"
    schema.write_bytes(schema.read_bytes()[:cut])
    line = _one_line_exit_2(_check("--checkpoint", str(ck_copy), str(CK / "plan.json")),
                            "corrupted state schema file", "state/0/0/_metadata/schema",
                            f"found {found}")
    assert "unpack" not in line and "buffer" not in line


def test_schema_file_that_is_a_directory(ck_copy, no_spark):
    schema = ck_copy / "state" / "0" / "0" / "_metadata" / "schema"
    schema.unlink()
    schema.mkdir()
    _one_line_exit_2(_check("--checkpoint", str(ck_copy), str(CK / "plan.json")),
                     "cannot read a state schema file", "state/0/0/_metadata/schema",
                     "found a directory")


def test_bad_flag_combinations():
    r = _check("--checkpoint", str(CK), str(CK / "plan.json"), str(CK / "plan.json"))
    _one_line_exit_2(r, "one plan")
    r = _check("--checkpoint", str(CK), "--query", "q", str(CK / "plan.json"))
    _one_line_exit_2(r, "both --checkpoint and --query")


def test_query_not_in_store(tmp_path):
    _one_line_exit_2(_check("--query", "nope", "--state", str(tmp_path / "st"),
                            str(CK / "plan.json")), "no query named 'nope'")


def test_query_checkpoint_on_other_host(tmp_path):
    from migrate.store import open_store

    store = open_store(str(tmp_path / "st"))
    store.put_plan("probe", (CK / "plan.json").read_text())
    store.set_status("probe", checkpoint="/elsewhere/ck/0", host="other-host")
    line = _one_line_exit_2(_check("--query", "probe", "--state", str(tmp_path / "st"),
                                   str(CK / "plan.json")), "on another host")
    assert "run this check on other-host" in line and "/elsewhere/ck/0" in line


def test_a_query_moved_to_another_host_is_located_there(tmp_path, monkeypatch):
    """``theseus run`` records the host it runs on at every start (was: only the first
    time), so a query that ran on host A and was started again on host B is looked for on
    B."""
    import socket

    import gates.broker
    import migrate.plantopics
    import migrate.run
    from migrate.ckcheck import locate
    from migrate.store import open_store

    state = str(tmp_path / "st")
    store = open_store(state)
    store.set_status("probe", status="stopped", checkpoint="/on-a/ck/0", host="host-a")

    class Started(Exception):
        pass

    def start_query(*a, **kw):
        raise Started

    monkeypatch.setattr(gates.broker, "check_access", lambda *a, **kw: None)
    monkeypatch.setattr(migrate.plantopics, "prepare", lambda *a, **kw: None)
    monkeypatch.setattr(migrate.run, "start_query", start_query)
    monkeypatch.setattr(socket, "gethostname", lambda: "host-b")
    with pytest.raises(Started):
        migrate.run.run(str(CK / "plan.json"), bootstrap="127.0.0.1:1", state=state,
                        echo=lambda s: None)
    assert open_store(state).status("probe")["host"] == "host-b"
    # seen from host A now: the checkpoint is on B
    monkeypatch.setattr(socket, "gethostname", lambda: "host-a")
    with pytest.raises(CheckpointError, match="run this check on host-b"):
        locate(state, "probe")


def test_bad_checkpoint_never_imports_pyspark(tmp_path):
    code = ("import sys\nfrom click.testing import CliRunner\nfrom migrate.cli import main\n"
            f"r = CliRunner().invoke(main, ['check', '--checkpoint', {str(tmp_path)!r}, "
            f"{str(CK / 'plan.json')!r}])\n"
            "assert r.exit_code == 2, r.output\n"
            "print(sorted(m for m in ('pyspark', 'confluent_kafka') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# -- migrate start --strategy auto consults the checkpoint before an in-place restart ------

def _migrator(tmp_path, strategy, outcome, monkeypatch):
    import migrate.ckcheck
    from migrate.context import Context
    from migrate.phases import check as check_phase
    from migrate.record import Migration
    from migrate.store import DirectoryStore

    store = DirectoryStore(tmp_path / "store")
    ck = tmp_path / "ck"
    shutil.copytree(CK, ck)
    store.put_plan("truth", (CK / "plan.json").read_text())
    store.set_status("truth", status="running", checkpoint=str(ck))
    m = Migration(id="m1", query="truth", new_plan=str(CK / "plan.json"),
                  old_instance="truth", strategy=strategy)
    m.save(store)
    seen = []

    class Answer:  # what check_checkpoint reports (its Spark part is the truth test's)
        checkpoint = {"restart": {"outcome": outcome, "reason": "because",
                                  "error_class": "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE"
                                  if outcome == "fails" else None}}

    def fake(ckpt, new_path, **kw):
        seen.append((ckpt, new_path, kw["query"], kw["state"]))
        return Answer()

    monkeypatch.setattr(migrate.ckcheck, "check_checkpoint", fake)
    monkeypatch.setattr(check_phase, "require_history", lambda m, ctx, new: None)
    monkeypatch.setattr(check_phase, "require_access", lambda m, ctx, old, new, shadow: None)
    monkeypatch.setattr(check_phase, "preflight", lambda m, ctx, new: {})
    lines: list[str] = []
    return m, Context(store, lines.append, 60), lines, seen, store


@pytest.mark.parametrize("outcome", ["fails", "wrong_state"])
def test_auto_falls_back_to_shadow_when_the_checkpoint_contradicts(tmp_path, monkeypatch,
                                                                    outcome):
    m, ctx, lines, seen, store = _migrator(tmp_path, "auto", outcome, monkeypatch)
    runner.step(m, ctx)  # identical plans: the plan check alone says in place
    assert seen == [(None, str(CK / "plan.json"), "truth", store.spec)]
    assert m.kind == "shadow" and m.phase == "shadow"
    assert m.checkpoint.startswith(outcome)
    assert any("checkpoint contradicts the plan check" in ln for ln in lines)


def test_in_place_is_refused_when_the_checkpoint_contradicts(tmp_path, monkeypatch):
    from compat.errors import Refused

    m, ctx, _lines, _seen, _store = _migrator(tmp_path, "in-place", "fails", monkeypatch)
    with pytest.raises(Refused, match="checkpoint contradicts.*STATE_STORE_KEY"):
        runner.step(m, ctx)
    assert m.phase == "refused"


def test_auto_restarts_in_place_when_the_checkpoint_agrees(tmp_path, monkeypatch):
    m, ctx, _lines, _seen, _store = _migrator(tmp_path, "auto", "starts", monkeypatch)
    runner.step(m, ctx)
    assert m.kind == "in_place" and m.checkpoint.startswith("starts")


@pytest.mark.parametrize("where,why", [
    ({"host": "host-b", "checkpoint": "/on-b/ck/0"},
     "the checkpoint /on-b/ck/0 is on host 'host-b', not on this host"),
    ({"checkpoint": "s3a://bucket/ck/0"},
     "the checkpoint s3a://bucket/ck/0 is not on a local filesystem (s3a:)"),
    ({"checkpoint": "hdfs://nn:8020/ck/0"}, "is not on a local filesystem (hdfs:)"),
    ({"host": None, "checkpoint": "/nowhere/ck/0"},
     "the store does not record which host holds it"),
    ({"checkpoint": None}, "the store records no checkpoint for the query"),
])
def test_auto_never_restarts_on_a_checkpoint_it_cannot_read(tmp_path, monkeypatch, where,
                                                             why):
    """The lead's policy: auto never restarts into a failure.  A checkpoint this host
    cannot read (another host, a non-local URI) verifies nothing, so auto migrates through
    a shadow and says why (it restarted in place on the plan check alone)."""
    m, ctx, lines, seen, store = _migrator(tmp_path, "auto", "starts", monkeypatch)
    store.set_status("truth", **where)
    runner.step(m, ctx)  # identical plans: the plan check alone says in place
    assert seen == []  # nothing to read here: the dry run never starts
    assert m.kind == "shadow" and m.phase == "shadow"
    assert m.checkpoint.startswith("not verified: ") and why in m.checkpoint
    said = [ln for ln in lines if "cannot be verified from this host" in ln]
    assert said and why in said[0] and "migrating through a shadow query" in said[0], lines


def test_explicit_in_place_restarts_on_an_unread_checkpoint_with_a_warning(tmp_path,
                                                                           monkeypatch):
    m, ctx, lines, seen, store = _migrator(tmp_path, "in-place", "starts", monkeypatch)
    store.set_status("truth", checkpoint="s3a://bucket/ck/0")
    runner.step(m, ctx)
    assert seen == [] and m.kind == "in_place"
    warn = [ln for ln in lines if "warning: the checkpoint was not verified" in ln]
    assert warn and "s3a://bucket/ck/0" in warn[0] and "--strategy in-place" in warn[0]


def test_a_checkpoint_never_written_on_the_querys_host_restarts(tmp_path, monkeypatch):
    """On the query's own host, a recorded checkpoint directory that does not exist was
    never written (the query never started a batch): a restart starts afresh, nothing can
    fail on it, and the plan check decides."""
    import socket

    m, ctx, _lines, seen, store = _migrator(tmp_path, "auto", "starts", monkeypatch)
    store.set_status("truth", checkpoint=str(tmp_path / "never"), host=socket.gethostname())
    runner.step(m, ctx)
    assert seen == [] and m.kind == "in_place"
    assert m.checkpoint.startswith("not verified: no checkpoint directory yet")


def test_a_file_uri_checkpoint_is_read(tmp_path, monkeypatch):
    m, ctx, _lines, seen, store = _migrator(tmp_path, "auto", "starts", monkeypatch)
    store.set_status("truth", checkpoint="file://" + str(tmp_path / "ck"))
    runner.step(m, ctx)
    assert len(seen) == 1 and m.kind == "in_place"


def test_check_query_on_a_non_local_checkpoint(tmp_path):
    from migrate.store import open_store

    store = open_store(str(tmp_path / "st"))
    store.put_plan("probe", (CK / "plan.json").read_text())
    store.set_status("probe", checkpoint="s3a://bucket/ck/0")
    _one_line_exit_2(_check("--query", "probe", "--state", str(tmp_path / "st"),
                            str(CK / "plan.json")), "not on a local filesystem",
                     "s3a://bucket/ck/0", "copy the checkpoint to local disk")


# -- the report: every format, the JSON valid against compat/schemas/report.v1.json ---------------

def _report(new_ops, recorded=None, rec_ops=None):
    from compat.checkpoint_check import checkpoint_report

    return checkpoint_report(read_checkpoint(CK), _plan(), new_ops, recorded, rec_ops)


def test_report_formats_and_schema():
    import jsonschema

    from compat.report import render
    from compat.schema_check import load_schema

    ck = read_checkpoint(CK)
    agg, dedup = ck.operators
    rep = _report(_new_ops([_with_store(agg, value_schema=_s("long")), dedup]))
    assert rep.verdict == "migrate" and rep.exit_code == 1
    doc = json.loads(render(rep, "json"))
    jsonschema.validate(doc, load_schema("report.v1.json"))
    assert doc["old"] == {"file": None, "query": "probe", "checkpoint": str(CK)}
    sec = doc["checkpoint"]
    assert sec["restart"]["outcome"] == "fails"
    assert sec["restart"]["error_class"] == "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE"
    assert sec["last_committed_batch"] == 1 and sec["shuffle_partitions"] == 3
    assert sec["sources"][0]["offsets"] == {"probe-17759073": {"0": 10, "1": 10}}
    assert sec["matched"] == [{"operator": 0, "checkpoint": "stateStoreSave",
                               "new": "stateStoreSave", "node": "agg"},
                              {"operator": 1, "checkpoint": "dedupe", "new": "dedupe",
                               "node": "d"}]
    assert doc["characteristics"]["old"] == ["stateful", "multistage"]
    # checkpoint alone: the sink and the state's meaning are said to be not verified
    codes = [f["code"] for f in doc["findings"]]
    assert codes.count("checkpoint-not-verified") == 2
    text = render(rep, "text")
    assert "restart on the checkpoint: Spark refuses to start " \
           "(STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE)" in text
    assert "operator 0 stateStoreSave (metadata v1, 3 partitions)" in text
    assert "store default: key struct<k:string>, value struct<sum:bigint,count:bigint>" in text
    assert "source 0: probe-17759073 [0:10, 1:10]" in text
    md = render(rep, "markdown")
    assert "<summary>Checkpoint</summary>" in md and "checkpoint-value-schema" in md
    sarif = json.loads(render(rep, "sarif"))
    assert {r["ruleId"] for r in sarif["runs"][0]["results"]} >= \
        {"checkpoint-value-schema-incompatible"}
    assert "::error " in render(rep, "github")


def test_report_with_recorded_plan_and_drift_first():
    from compat.report import render

    ck = read_checkpoint(CK)
    agg, dedup = ck.operators
    # the recorded plan would have written another key: the checkpoint is not its
    rec_ops = _new_ops([_with_store(agg, key_schema=_s("string", "string")), dedup])
    rep = _report(_new_ops(), recorded=_plan(), rec_ops=rec_ops)
    assert rep.findings[0].code == "checkpoint-drift"
    assert "struct<k:string> in the checkpoint, struct<f0:string,f1:string>" in \
        rep.findings[0].message
    assert rep.checkpoint["drift"] and rep.checkpoint["restart"]["outcome"] == "starts"
    assert "old: " + str(CK / "plan.json") + " + checkpoint" in render(rep, "text")
    # drift and a finding of a worse effect: drift is still first, in every format, and
    # the checkpoint block lists the differences
    more = _new_ops([_with_store(agg, value_schema=_s("long")), dedup])
    rep = _report(more, recorded=_plan(), rec_ops=rec_ops)
    assert rep.verdict == "migrate"
    codes = [f.code for f in rep.findings]
    assert codes[0] == "checkpoint-drift" and "checkpoint-value-schema-incompatible" in codes
    text = render(rep, "text")
    marks = [ln for ln in text.splitlines() if ln.startswith(("✗", "!", "·"))]
    assert marks[0].startswith("! [checkpoint-drift] in_place:"), marks
    assert marks[1].startswith("✗ [checkpoint-value-schema-incompatible] migrate:"), marks
    block = text.split("restart on the checkpoint")[0]
    assert "DRIFT: the checkpoint was not made by the store's recorded plan" in block
    assert "- operator 0 (stateStoreSave) key struct<k:string> in the checkpoint, " \
        "struct<f0:string,f1:string> from the recorded plan" in block
    assert "and the recorded plan did not make this checkpoint" in text
    assert "there is the recorded plan" not in text
    assert [f["code"] for f in json.loads(render(rep, "json"))["findings"]][0] == \
        "checkpoint-drift"
    assert "checkpoint-drift" in render(rep, "markdown").split("| ✗ |")[0]
    assert json.loads(render(rep, "sarif"))["runs"][0]["results"][0]["ruleId"] == \
        "checkpoint-drift"
    assert "checkpoint-drift" in render(rep, "github").splitlines()[0]
    # no drift: the plan check of the recorded plan is part of the report
    rep = _report(_new_ops(), recorded=_plan(), rec_ops=_new_ops())
    assert rep.verdict == "identical" and rep.checkpoint["drift"] == []
    assert rep.findings == []


@pytest.mark.parametrize("require,verdict", [([], "in_place"), (["backfill"], "migrate")])
def test_restart_prediction_is_sparks_not_the_requirement(tmp_path, require, verdict):
    """A passive filter before the state: Spark restarts on correct state whatever the
    user requires; --require backfill changes the verdict (history must be recomputed: a
    migration), never the prediction of what Spark does (was wrong_state)."""
    from compat.checkpoint_check import checkpoint_report

    doc = json.loads((CK / "plan.json").read_text())
    doc["nodes"].insert(1, {"id": "f", "step": "filter", "version": 1, "inputs": ["src"],
                            "predicate": "v >= 0"})
    doc["nodes"][2]["inputs"] = ["f"]  # the dedup now reads the filter
    (tmp_path / "new.json").write_text(json.dumps(doc))
    new = load_plan(str(tmp_path / "new.json"))
    rep = checkpoint_report(read_checkpoint(CK), new, _new_ops(), _plan(), _new_ops(),
                            require=require)
    assert rep.verdict == verdict
    assert [f.code for f in rep.findings] == ["passive-added"], \
        [f.code for f in rep.findings]
    assert rep.checkpoint["restart"] == {
        "outcome": "starts", "error_class": None,
        "reason": "the checkpoint's operators, state schemas and sources fit the new plan"}


def test_stateless_checkpoint_says_so_and_checks_sources():
    from compat.checkpoint_check import checkpoint_report

    ck = read_checkpoint(CK)
    ck.operators = []
    new_ops = _new_ops([])
    rep = checkpoint_report(ck, _plan(), new_ops)
    assert [f.code for f in rep.findings if f.code != "checkpoint-not-verified"] == \
        ["checkpoint-stateless"]
    # a checkpoint alone never makes two plans "identical": it says the restart works
    assert rep.verdict == "in_place" and rep.checkpoint["restart"]["outcome"] == "starts"
    two = _new_ops([], offsets=[{"theseus_empty": "src"}, {"theseus_empty": "src"}])
    rep = checkpoint_report(ck, _plan(), two)
    assert rep.checkpoint["restart"]["outcome"] == "fails"


def test_stateless_checkpoint_through_the_cli(tmp_path, monkeypatch):
    """A checkpoint without state/ (a stateless query's) through ``theseus check
    --checkpoint``: not an error; a stateless new plan is ``checkpoint-stateless`` (exit 0),
    a stateful one ``checkpoint-state-missing`` (exit 1).  The dry run is stubbed with what
    Spark plans for such plans (no operator; one source)."""
    import migrate.stateops

    ck = tmp_path / "ck"
    shutil.copytree(CK, ck, ignore=lambda d, names: ["state"] if d == str(CK) else [])
    assert not (ck / "state").exists() and (ck / "commits" / "1").exists()
    seen = []

    def dry_run(plan, spark=None, shuffle_partitions=None, timeout=300.0, conf=None,
                form="theseus"):
        seen.append((plan.query, shuffle_partitions))
        return _new_ops([] if not any(plan.info[n].stateful for n in plan.nodes)
                        else read_checkpoint(CK).operators)

    monkeypatch.setattr(migrate.stateops, "plan_operators", dry_run)
    doc = json.loads((CK / "plan.json").read_text())
    doc["nodes"] = [doc["nodes"][0],
                    {"id": "f", "step": "filter", "version": 1, "inputs": ["src"],
                     "predicate": "v > 0"},
                    doc["nodes"][3] | {"inputs": ["f"], "mode": "append"}]
    (tmp_path / "stateless.json").write_text(json.dumps(doc))
    r = _check("--checkpoint", str(ck), str(tmp_path / "stateless.json"))
    assert r.exit_code == 0, r.output
    assert "Traceback" not in r.output and "internal error" not in r.output
    assert "[checkpoint-stateless] none: the checkpoint holds no state" in r.output
    assert "restart on the checkpoint: Spark starts, state intact" in r.output
    assert "no stateful operator" in r.output and "source 0: probe-17759073 [0:10, 1:10]" \
        in r.output
    assert seen == [("probe", 3)]  # the checkpoint's pinned partitions
    doc = json.loads(_check("--checkpoint", str(ck), str(tmp_path / "stateless.json"),
                            "--format", "json").output)
    assert [f["code"] for f in doc["findings"]
            if f["code"] != "checkpoint-not-verified"] == ["checkpoint-stateless"]
    assert doc["verdict"] == "in_place" and doc["checkpoint"]["operators"] == []
    r = _check("--checkpoint", str(ck), str(CK / "plan.json"))
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert "[checkpoint-state-missing]" in r.output
    assert "Spark refuses to start (STREAMING_STATEFUL_OPERATOR_MISSING_STATE_DIRECTORY)" \
        in r.output


def test_corrupted_uncommitted_offsets_file_is_caught(ck_copy):
    # Spark reruns a planned batch at restart: its offsets file is read first
    (ck_copy / "offsets" / "2").write_text("v1\nnot json\n")
    _one_line_exit_2(_check("--checkpoint", str(ck_copy), str(CK / "plan.json")),
                     "corrupted offsets file", "offsets/2")


@pytest.mark.parametrize("version,effect", [("2", "in_place"), ("1", "migrate"),
                                            (None, "migrate")])
def test_join_type_change_follows_the_join_state_format(version, effect):
    """join_stream_stream_type_changed: the plan check says in_place on the condition of
    join state format 2 (a matched flag per row whatever the join type: inner -> left outer
    restarts right, measured in the truth test and by prove); the checkpoint says whether
    it holds.  Format 1, or none recorded (format 1 to Spark), keeps no flag: migrate."""
    from compat.check import check_plans
    from compat.checkpoint_check import _join_type

    case = FIXTURES / "upgrades" / "join_stream_stream_type_changed"
    old, new = load_plan(str(case / "old.json")), load_plan(str(case / "new.json"))
    (f,) = [f for f in check_plans(old, new).findings if f.code == "join-type-changed"]
    assert (f.effect, f.history) == ("in_place", True)
    ck = read_checkpoint(CK)
    key = "spark.sql.streaming.join.stateFormatVersion"
    if version is None:
        ck.conf.pop(key, None)
    else:
        ck.conf[key] = version
    got = _join_type(f, ck, old, new)
    assert got.effect == effect
    if effect == "in_place":
        assert got.history and "format v2: the condition holds" in got.message
    else:
        assert not got.history and "keeps no matched flag: migrate" in got.message
        assert f"format v{version or '1 (none recorded)'}" in got.message


@pytest.mark.parametrize("require,effect", [([], "in_place"), (["backfill"], "migrate")])
def test_join_type_change_in_the_report_honours_backfill(require, effect):
    from compat.checkpoint_check import checkpoint_report

    case = FIXTURES / "upgrades" / "join_stream_stream_type_changed"
    old, new = load_plan(str(case / "old.json")), load_plan(str(case / "new.json"))
    ck = read_checkpoint(CK)  # join state format 2, as Spark 4.3 writes it
    assert ck.conf["spark.sql.streaming.join.stateFormatVersion"] == "2"
    rep = checkpoint_report(ck, new, _new_ops(offsets=[{"theseus_empty": "orders"}]), old,
                            _new_ops(offsets=[{"theseus_empty": "orders"}]), require=require)
    (f,) = [f for f in rep.findings if f.code == "join-type-changed"]
    assert f.effect == effect


def test_v2_operator_metadata_without_its_schema_file_is_not_verified(ck_copy):
    """OperatorStateMetadataV2 (transformWithState): the fields of Spark's case class
    (operatorInfo, stateStoreInfo with stateSchemaFilePath, operatorPropertiesJson) under
    state/<op>/_metadata/v2/<batch>.  Its schema file missing here, the store's key and
    value are said to be not verified, never guessed.  (A real one:
    test_real_transform_with_state_checkpoint.)"""
    op = ck_copy / "state" / "0" / "_metadata"
    (op / "v2").mkdir()
    (op / "v2" / "1").write_text("v2\n" + json.dumps({
        "operatorInfo": {"operatorId": 0, "operatorName": "transformWithStateExec"},
        "stateStoreInfo": [{"storeName": "default", "numColsPrefixKey": 0,
                            "numPartitions": 3,
                            "stateSchemaFilePath": "file:/gone/_stateSchema/default/0_x"}],
        "operatorPropertiesJson": "{}"}) + "\n")
    ck = read_checkpoint(ck_copy)
    tws = ck.operators[0]
    assert (tws.id, tws.name, tws.metadata_version, tws.partitions) == \
        (0, "transformWithStateExec", 2, 3)
    assert tws.stores[0].key_schema is None
    fs = compare(ck, _new_ops(ck.operators), _plan())
    assert _codes(fs) == ["checkpoint-not-verified"]
    assert "records no state schema" in fs[0].message


def test_real_transform_with_state_checkpoint():
    """A real checkpoint of a table aggregate over a changelog (two
    transformWithStateInPandas operators), written by PySpark 4.3 (operator metadata v2
    with ``stateSchemaFilePaths``, v3 schema files with schema ids; its recorded absolute
    paths are gone, the files are found under ``_stateSchema``)."""
    ck = read_checkpoint(FIXTURES / "checkpoints" / "table_agg_tws")
    assert [(op.id, op.name, op.metadata_version, op.partitions) for op in ck.operators] == \
        [(0, "transformWithStateInPandasExec", 2, 2), (1, "transformWithStateInPandasExec",
                                                      2, 2)]
    stores = [[s.to_json() for s in op.stores] for op in ck.operators]
    assert stores == [[{"name": "s", "partitions": 2, "key_schema": f"struct<{k}:string>",
                        "value_schema": f"struct<{v}:string>"}]
                      for k, v in (("_theseus_key", "st"), ("_theseus_key", "row"))]


@pytest.mark.parametrize("recorded", [True, False], ids=["with-recorded-plan", "alone"])
def test_a_state_partition_change_keeps_the_plan_checks_verdict_and_says_spark_starts(
        tmp_path, recorded):
    """One verdict for one change: state_partitions 3 -> 8 is ``migrate`` plan against plan;
    against the checkpoint Spark starts and keeps 3, which the check says beside the verdict
    (the restart's prediction and checkpoint-partitions-pinned), never by saying
    ``in_place`` for a change the restart would silently not make."""
    from compat.check import check_plans
    from compat.checkpoint_check import checkpoint_report

    doc = json.loads((CK / "plan.json").read_text())
    doc["config"]["state_partitions"] = 8
    (tmp_path / "new.json").write_text(json.dumps(doc))
    new = load_plan(str(tmp_path / "new.json"))
    assert check_plans(_plan(), new).verdict == "migrate"
    args = (_plan(), _new_ops()) if recorded else ()
    rep = checkpoint_report(read_checkpoint(CK), new, _new_ops(), *args)
    assert rep.verdict == "migrate" and rep.exit_code == 1
    codes = [f.code for f in rep.findings]
    assert "checkpoint-partitions-pinned" in codes
    assert ("state-partitions-changed" in codes) == recorded
    assert rep.checkpoint["restart"]["outcome"] == "starts"
    pinned = next(f for f in rep.findings if f.code == "checkpoint-partitions-pinned")
    assert "Spark starts, the state stays in 3 partitions" in pinned.message
