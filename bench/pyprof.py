"""Where the Python workers' time went: cProfile files (``migrate.build.profiling``) added
up and split into parts that partition the profiled time (each function's own time goes to
exactly one part), plus the cumulative time and calls of the functions that say what the
parts mean (state calls, per-key frames, output conversion, the group function)."""

from __future__ import annotations

import pstats
from typing import Any

#: (part, test on (file, function name)), first match wins; the rest is "other"
PARTS: list[tuple[str, Any]] = [
    ("socket wait (JVM: input rows, state server replies)",
     lambda f, n: f == "~" and any(s in n for s in ("recv", "readinto", "'read'", "sendall",
                                                    "'write'", "'flush'", "select"))),
    ("theseus group functions (migrate/build)", lambda f, n: "/migrate/build/" in f),
    ("json", lambda f, n: "/json/" in f or "_json" in n),
    ("state client + protobuf (pyspark/sql/streaming, google/protobuf)",
     lambda f, n: "/pyspark/sql/streaming/" in f or "/google/protobuf/" in f
     or "protobuf" in n),
    ("pandas", lambda f, n: "/pandas/" in f),
    ("pyarrow", lambda f, n: "/pyarrow/" in f or "pyarrow" in n),
    ("pyspark worker, serializers, conversions", lambda f, n: "/pyspark/" in f),
    ("numpy", lambda f, n: "/numpy/" in f or "numpy" in n),
]

#: functions whose cumulative time is reported: (label, file part, function name)
MARKERS = [
    ("handleInputRows (generator: a call per key and per frame it yields)", "migrate/build/",
     "handleInputRows"),
    ("state call round trips: send", "stateful_processor_api_client.py", "_send_proto_message"),
    ("state call round trips: receive", "stateful_processor_api_client.py",
     "_receive_proto_message"),
    ("set_implicit_key (PySpark, per key)", "stateful_processor_api_client.py",
     "set_implicit_key"),
    ("value state exists", "value_state_client.py", "exists"),
    ("value state get", "value_state_client.py", "get"),
    ("value state update", "value_state_client.py", "update"),
    ("value state clear", "value_state_client.py", "clear"),
    ("our output frame (_frame)", "migrate/build/changelog.py", "_frame"),
    ("pandas.DataFrame.__init__", "pandas/core/frame.py", "__init__"),
    ("output pandas -> Arrow (PandasToArrowConversion.convert)", "pyspark/", "convert"),
    ("input Arrow -> pandas (ArrowBatchTransformer.to_pandas)", "pyspark/", "to_pandas"),
    ("itertuples", "pandas/core/frame.py", "itertuples"),
    ("row API: input Rows from Arrow (generate_data_batches)", "pyspark/worker.py",
     "generate_data_batches"),
    ("row API: output Rows -> Arrow, one batch per key (convert_results)", "pyspark/worker.py",
     "convert_results"),
    ("pyarrow RecordBatch.from_pylist", "pyarrow", "from_pylist"),
    ("json.loads", "json/__init__.py", "loads"),
    ("json.dumps", "json/__init__.py", "dumps"),
]


def _name(key: tuple[str, int, str]) -> tuple[str, str]:
    f, _line, n = key
    return f, n


def breakdown(stats: pstats.Stats) -> dict[str, Any]:
    """The parts of the profiled time (seconds, own time), the markers' cumulative seconds
    and calls, and the top functions by own time."""
    raw = stats.stats  # type: ignore[attr-defined]
    parts: dict[str, float] = {p: 0.0 for p, _ in PARTS}
    parts["other"] = 0.0
    total = 0.0
    for key, (_cc, _nc, tt, _ct, _callers) in raw.items():
        f, n = _name(key)
        total += tt
        for part, test in PARTS:
            if test(f, n):
                parts[part] += tt
                break
        else:
            parts["other"] += tt
    markers = {}
    for label, file_part, func in MARKERS:
        calls, cum = 0, 0.0
        for key, (_cc, nc, _tt, ct, _callers) in raw.items():
            f, n = _name(key)
            if n == func and file_part in f:
                calls += nc
                cum += ct
        markers[label] = {"calls": calls, "cum_s": round(cum, 3)}
    top = sorted(raw.items(), key=lambda kv: -kv[1][2])[:25]
    return {
        "profiled_s": round(total, 3),
        "parts_s": {k: round(v, 3) for k, v in sorted(parts.items(), key=lambda kv: -kv[1])},
        "markers": markers,
        "top_own_time": [{"function": f"{k[0].rsplit('/', 3)[-1] if k[0] != '~' else ''}"
                          f":{k[2]}", "calls": v[1], "own_s": round(v[2], 3),
                          "cum_s": round(v[3], 3)} for k, v in top],
    }
