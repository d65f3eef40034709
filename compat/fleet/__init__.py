"""The fleet: many queries chained through Kafka topics, as one global plan.

A fleet is a directory tree of plans (``*.json``, and ``*.sql`` compiled on the fly), one
query each; a sink topic that another query's source reads is an edge between them.

- ``graph``: loading a fleet, the global graph (networkx, imported lazily: it stays off
  ``theseus check``'s path), topological order, cycles, external inputs and outputs.
- ``show``: ``theseus fleet show``: the global plan as text, JSON (``compat/schemas/fleet.v1.json``)
  and an HTML page drawing it.
- ``contract``: what a producer writes to its topic (columns, types, key, changelog mode,
  format) and what a consumer's source declares and uses; the ``upstream-*`` findings.
- ``signature``: canonical signatures of subplans, shared subplans across queries.
- ``optimize``: rewriting a fleet so that a shared subplan is computed once.
- ``check``: ``theseus fleet check``: per-query checks, impacts across topic edges,
  cascading migrations and their waves.
"""
