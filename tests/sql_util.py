"""Helpers for the SQL compiler tests: a few declared topics and compile shortcuts."""

from __future__ import annotations

from typing import Any

from compat.sql import compile_script, compile_sql, ir

DDL = """\
CREATE TABLE orders (order_id STRING, customer_id STRING, region STRING, amount DOUBLE,
                     quantity INT, ts TIMESTAMP)
  USING kafka OPTIONS (partitions 3, event_time 'ts', watermark '1 minute');
CREATE TABLE customers (customer_id STRING, tier STRING, country STRING)
  USING kafka OPTIONS (role 'table', key 'customer_id');
CREATE TABLE payments (payment_id STRING, order_id STRING, paid DOUBLE, pts TIMESTAMP)
  USING kafka OPTIONS (partitions 3, event_time 'pts', watermark '1 minute');
CREATE TABLE clicks (click_id STRING, user_id STRING, page STRING, tags ARRAY<STRING>,
                     ts TIMESTAMP)
  USING kafka OPTIONS (partitions 6, event_time 'ts', watermark '10 seconds');
CREATE TABLE orders_eu (order_id STRING, region STRING, amount DOUBLE, ts TIMESTAMP)
  USING kafka OPTIONS (event_time 'ts', watermark '1 minute');
CREATE TABLE orders_us (order_id STRING, region STRING, amount DOUBLE, ts TIMESTAMP)
  USING kafka OPTIONS (event_time 'ts', watermark '1 minute');
"""

NO_RULES: tuple[str, ...] = ()


def graph(sql: str, rules: tuple[str, ...] | None = None) -> ir.Graph:
    """The compiled graph of ``DDL + sql`` (``rules=NO_RULES``: as translated)."""
    return compile_script(DDL + sql, "q.sql", rules=rules).graph


def explain(sql: str, rules: tuple[str, ...] | None = None) -> str:
    return ir.explain(graph(sql, rules))


def plan(sql: str) -> dict[str, Any]:
    return compile_sql(DDL + sql, "q.sql")


def nodes(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["id"]: n for n in doc["nodes"]}


def lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip().splitlines()]
