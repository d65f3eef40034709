"""Plans to and from JSON documents: the only module that knows the JSON layout.

``load`` reads a file, validates it against ``schemas/plan.v1.json`` and builds the model;
``from_doc`` builds the model from an already schema-valid document; ``to_doc`` writes it
back.  Every fixture is round-tripped in a test.
"""

from __future__ import annotations

import json
from typing import Any

from compat import schema_check
from compat.errors import PlanError
from compat.model import (
    AggCall,
    Aggregate,
    Column,
    Deduplicate,
    EventTime,
    Explode,
    Filter,
    Join,
    NamedExpr,
    Node,
    OrderKey,
    Plan,
    Project,
    Recursive,
    Sink,
    Source,
    StartGate,
    StopGate,
    TopN,
    Union,
    Window,
    build_graph,
)

FORMAT = "theseus.plan/1"


def read_json(path: str, raw: bytes | None = None) -> Any:
    """Read a JSON file; unreadable files and malformed JSON become one PlanError.

    ``raw`` gives the file's bytes when they do not come from disk (a file at a git ref).
    """
    try:
        if raw is None:
            with open(path, "rb") as f:
                raw = f.read()
    except FileNotFoundError:
        raise PlanError("file not found", file=path, expected="a readable plan file",
                        found="no such file") from None
    except IsADirectoryError:
        raise PlanError("is a directory", file=path, expected="a plan file",
                        found="a directory") from None
    except OSError as e:
        raise PlanError(f"cannot read file: {e.strerror}", file=path) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PlanError(f"not UTF-8 text (byte {e.start})", file=path,
                        expected="a UTF-8 JSON document", found="binary data") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        line = text.splitlines()[e.lineno - 1] if text.splitlines() else ""
        raise PlanError(f"malformed JSON at line {e.lineno}, column {e.colno}: {e.msg}",
                        file=path, pointer=None, expected="a JSON document",
                        found=repr(line.strip()[:60]) if line.strip() else "empty file"
                        ) from None


def load(path: str, reuse: Plan | None = None, raw: bytes | None = None) -> Plan:
    """Read, schema-validate and build a plan (semantic checks live in ``compat.infer``)."""
    doc = read_json(path, raw)
    return from_doc(doc, path, reuse)


def from_doc(doc: Any, file: str = "<plan>", reuse: Plan | None = None) -> Plan:
    """Build a plan from a document.

    With ``reuse`` (a plan loaded before, typically the old side of a check), a node whose
    document equals the old one's, key for key, was already validated and is shared as the
    same object instead of being validated and built again.
    """
    if isinstance(doc, dict) and doc.get("format") not in (FORMAT, None) and \
            isinstance(doc.get("format"), str):
        raise PlanError("unsupported plan format", file=file, pointer="/format",
                        expected=f"'{FORMAT}'", found=repr(doc["format"]))
    old_docs = reuse.documents if reuse is not None else {}
    if not old_docs:
        schema_check.validate(doc, "plan.v1.json", file)
    else:
        shallow = schema_check.compiled("plan.v1.json", None, True)
        node_ok = schema_check.compiled("plan.v1.json", "#/$defs/node")
        ok = shallow(doc)
        if ok:
            for d in doc["nodes"]:
                prev = old_docs.get(d.get("id")) if type(d) is dict else None
                if (prev is None or prev != d) and not node_ok(d):
                    ok = False
                    break
        if not ok:
            raise schema_check.explain(doc, "plan.v1.json", file)
    pointers: dict[str, str] = {}
    documents: dict[str, Any] = {}
    old_nodes = reuse.nodes if reuse is not None else {}
    try:
        nodes = []
        for i, d in enumerate(doc["nodes"]):
            nid = d["id"]
            prev = old_docs.get(nid)
            if prev is not None and prev == d and nid in old_nodes and nid not in pointers:
                node = old_nodes[nid]
                pointers[nid] = f"/nodes/{i}"
            else:
                node = _node(d, f"/nodes/{i}", pointers)
            if isinstance(node, Recursive):
                _body_pointers(node, d, f"/nodes/{i}", pointers)
            nodes.append(node)
            documents[nid] = d
    except PlanError as e:
        raise e.with_location(file=file) from None
    by_id, dependents = build_graph(nodes, file, pointers)
    sinks = [n.id for n in nodes if isinstance(n, Sink)]
    if len(sinks) != 1:
        found = ", ".join(f"'{s}' at {pointers[s]}" for s in sinks) or "none"
        raise PlanError("a plan has exactly one sink", file=file,
                        node=sinks[1] if len(sinks) > 1 else None,
                        pointer=pointers[sinks[1]] if len(sinks) > 1 else "/nodes",
                        expected="exactly one sink step", found=found)
    for n in nodes:
        if isinstance(n, Recursive):
            _check_body(n, file, pointers)
    plan = Plan(query=doc["query"], nodes=by_id, config=dict(doc.get("config", {})),
                metadata=dict(doc.get("metadata", {})),
                extras={k: v for k, v in doc.items() if k.startswith("x-")},
                file=file, pointers=pointers, dependents=dependents, sink_id=sinks[0],
                documents=documents)
    return plan


def _body_pointers(rec: Recursive, d: dict[str, Any], ptr: str,
                   pointers: dict[str, str]) -> None:
    for j, b in enumerate(d["body"]):
        pointers.setdefault(f"{rec.id}/{b['id']}", f"{ptr}/body/{j}")


def _check_body(rec: Recursive, file: str, pointers: dict[str, str]) -> None:
    """The body is its own graph; its nodes may read ``body_input``, the looped stream."""
    base = pointers[rec.id]
    inner: dict[str, str] = {n.id: pointers[f"{rec.id}/{n.id}"] for n in rec.body}
    ids = set(inner)
    if rec.body_input in ids:
        raise PlanError("body_input must name the looped stream, not a body node", file=file,
                        node=rec.id, pointer=base + "/body_input",
                        expected="a name no body node uses", found=repr(rec.body_input))
    virtual = Source(id=rec.body_input, version=1, inputs=())
    pseudo = [virtual] + [n for n in rec.body]
    inner[rec.body_input] = base + "/body_input"
    build_graph(pseudo, file, inner, where=f" (in the body of '{rec.id}')")
    if rec.body_output not in ids:
        raise PlanError("body_output is not a body node", file=file, node=rec.id,
                        pointer=base + "/body_output",
                        expected="one of " + ", ".join(sorted(ids)),
                        found=repr(rec.body_output))
    for n in rec.body:
        if isinstance(n, (Source, Sink, Recursive)):
            raise PlanError(f"a {n.step} step cannot be inside a recursive body", file=file,
                            node=n.id, pointer=inner[n.id] + "/step",
                            expected="passive or stateful steps", found=repr(n.step))


def _named(items: list[dict[str, Any]]) -> tuple[NamedExpr, ...]:
    return tuple(NamedExpr(i["name"], i["expr"]) for i in items)


def _node(d: dict[str, Any], ptr: str, pointers: dict[str, str], prefix: str = "") -> Node:
    step = d["step"]
    nid = d["id"]
    key = prefix + nid
    if key in pointers:
        raise PlanError(f"duplicate node id '{nid}'", node=nid, pointer=ptr + "/id",
                        expected="ids unique within the plan",
                        found=f"'{nid}' already used at {pointers[key]}")
    pointers[key] = ptr
    common = (nid, d["version"], tuple(d.get("inputs", ())))
    if step == "filter":
        return Filter(*common, predicate=d["predicate"])
    if step == "project":
        return Project(*common, columns=_named(d["columns"]))
    if step == "source":
        et = d.get("event_time")
        return Source(*common, topic=d["topic"], partitions=d["partitions"],
                      format=d["format"],
                      schema=tuple(Column(c["name"], c["type"], c.get("nullable", True))
                                   for c in d["schema"]),
                      role=d["role"], key_columns=tuple(d.get("key_columns", ())),
                      event_time=EventTime(et["column"], et["watermark"]) if et else None,
                      starting_offsets=d.get("starting_offsets", "earliest"))
    if step == "aggregate":
        w = d.get("window")
        return Aggregate(*common, group_by=_named(d["group_by"]),
                         aggregates=tuple(AggCall(a["name"], a["function"], tuple(a["args"]),
                                                  a.get("distinct", False))
                                          for a in d["aggregates"]),
                         window=Window(w["type"], w["column"], w["size"], w.get("slide"),
                                       w.get("gap")) if w else None)
    if step == "sink":
        return Sink(*common, topic=d["topic"], format=d["format"],
                    key_columns=tuple(d["key_columns"]), mode=d["mode"],
                    delivery=d["delivery"])
    if step == "join":
        return Join(*common, type=d["type"], left_keys=tuple(d["left_keys"]),
                    right_keys=tuple(d["right_keys"]), condition=d.get("condition"),
                    time_bound=d.get("time_bound"))
    if step == "explode":
        return Explode(*common, expr=d["expr"], alias=d["as"], outer=d.get("outer", False))
    if step == "union":
        return Union(*common)
    if step == "deduplicate":
        return Deduplicate(*common, keys=tuple(d["keys"]), within=d.get("within"))
    if step == "top_n":
        return TopN(*common, partition_by=tuple(d["partition_by"]),
                    order_by=tuple(OrderKey(o["expr"], o.get("desc", False))
                                   for o in d["order_by"]), n=d["n"])
    if step == "recursive":
        body = tuple(_node(b, f"{ptr}/body/{j}", pointers, prefix=f"{nid}/")
                     for j, b in enumerate(d["body"]))
        return Recursive(*common, body=body, body_input=d["body_input"],
                         body_output=d["body_output"],
                         feedback_partitions=d["feedback"]["partitions"])
    if step == "stop_gate":
        return StopGate(*common, migration=d.get("migration"))
    if step == "start_gate":
        return StartGate(*common, migration=d.get("migration"))
    raise AssertionError(f"schema admitted unknown step {step!r}")  # pragma: no cover


# ---------------------------------------------------------------------------------------


def to_doc(plan: Plan) -> dict[str, Any]:
    doc: dict[str, Any] = {"format": FORMAT, "query": plan.query}
    if plan.config:
        doc["config"] = dict(plan.config)
    if plan.metadata:
        doc["metadata"] = dict(plan.metadata)
    doc.update(plan.extras)
    doc["nodes"] = [node_doc(n) for n in plan.nodes.values()]
    return doc


def node_doc(n: Node) -> dict[str, Any]:
    d: dict[str, Any] = {"id": n.id, "step": n.step, "version": n.version}
    if n.inputs:
        d["inputs"] = list(n.inputs)
    if isinstance(n, Filter):
        d["predicate"] = n.predicate
    elif isinstance(n, Project):
        d["columns"] = [{"name": c.name, "expr": c.expr} for c in n.columns]
    elif isinstance(n, Source):
        d.update(topic=n.topic, partitions=n.partitions, format=n.format, role=n.role)
        d["schema"] = [{"name": c.name, "type": c.type} | ({} if c.nullable
                                                             else {"nullable": False})
                       for c in n.schema]
        if n.key_columns:
            d["key_columns"] = list(n.key_columns)
        if n.event_time:
            d["event_time"] = {"column": n.event_time.column,
                               "watermark": n.event_time.watermark}
        if n.starting_offsets != "earliest":
            d["starting_offsets"] = n.starting_offsets
    elif isinstance(n, Aggregate):
        d["group_by"] = [{"name": g.name, "expr": g.expr} for g in n.group_by]
        d["aggregates"] = [{"name": a.name, "function": a.function, "args": list(a.args)}
                           | ({"distinct": True} if a.distinct else {})
                           for a in n.aggregates]
        if n.window:
            w = {"type": n.window.type, "column": n.window.column, "size": n.window.size}
            if n.window.slide:
                w["slide"] = n.window.slide
            if n.window.gap:
                w["gap"] = n.window.gap
            d["window"] = w
    elif isinstance(n, Sink):
        d.update(topic=n.topic, format=n.format, key_columns=list(n.key_columns),
                 mode=n.mode, delivery=n.delivery)
    elif isinstance(n, Join):
        d.update(type=n.type, left_keys=list(n.left_keys), right_keys=list(n.right_keys))
        if n.condition:
            d["condition"] = n.condition
        if n.time_bound:
            d["time_bound"] = n.time_bound
    elif isinstance(n, Explode):
        d.update(expr=n.expr)
        d["as"] = n.alias
        if n.outer:
            d["outer"] = True
    elif isinstance(n, Deduplicate):
        d["keys"] = list(n.keys)
        if n.within:
            d["within"] = n.within
    elif isinstance(n, TopN):
        d["partition_by"] = list(n.partition_by)
        d["order_by"] = [{"expr": o.expr} | ({"desc": True} if o.desc else {})
                         for o in n.order_by]
        d["n"] = n.n
    elif isinstance(n, Recursive):
        d["body"] = [node_doc(b) for b in n.body]
        d.update(body_input=n.body_input, body_output=n.body_output,
                 feedback={"partitions": n.feedback_partitions})
    elif isinstance(n, (StopGate, StartGate)):
        if n.migration:
            d["migration"] = n.migration
    return d


def dumps(plan: Plan) -> str:
    return json.dumps(to_doc(plan), indent=2) + "\n"
