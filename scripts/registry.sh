#!/usr/bin/env bash
# Local schema registry: Apicurio Registry 2.6 (in-memory storage) from Maven Central.
#
#   scripts/registry.sh start   start (or reuse) the registry; last stdout line:
#                               SCHEMA_REGISTRY_URL=http://127.0.0.1:PORT/apis/ccompat/v7
#   scripts/registry.sh stop    stop the registry started by `start` (idempotent)
#   scripts/registry.sh status  say whether it runs (exit 0 running, 3 stopped)
#
# Clients speak its Confluent-compatible API (ccompat v7), so the URL printed is that API's
# root: what a Confluent client takes as `schema.registry.url`.
#
# Env: SCHEMA_REGISTRY_URL (use that registry if it answers), REGISTRY_PORT (18081; moves up
#      when taken unless set), REGISTRY_START_TIMEOUT (120 s), REGISTRY_HEAP_OPTS
#      (-Xms64m -Xmx384m), REGISTRY_STATE (.cache/registry).
# The distribution (io.apicurio:apicurio-registry-app:2.6.13.Final, classifier all, tar.gz:
# a Quarkus runner jar beside its lib/) is fetched once with Maven into .cache/registry/app;
# registry.pid, registry.port and registry.log live in the state directory.  Storage is in
# memory: a restart forgets every schema (and ids start again at 1).
# Progress goes to stderr; only the SCHEMA_REGISTRY_URL= line goes to stdout.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="${REGISTRY_STATE:-$ROOT/.cache/registry}"
GAV="io.apicurio:apicurio-registry-app:2.6.13.Final:tar.gz:all"
APP="$ROOT/.cache/registry/app"
JAR="$APP/apicurio-registry-app-2.6.13.Final-runner.jar"
PIDFILE="$STATE/registry.pid"
PORTFILE="$STATE/registry.port"
LOG="$STATE/registry.log"
HOST=127.0.0.1
API=/apis/ccompat/v7

# A daemon must not keep the caller's file descriptors: run under `flock LOCK make registry`,
# it would otherwise hold LOCK for as long as it lives.
# shellcheck disable=SC2016
CLOSE_FDS='for fd in /proc/$$/fd/*; do fd=${fd##*/}; [ "$fd" -gt 2 ] && eval "exec $fd>&-"; done; '

say() { echo "registry: $*" >&2; }
die() { echo "registry: error: $*" >&2; exit 1; }

port_open() { timeout 2 bash -c ">/dev/tcp/$1/$2" 2>/dev/null; }

# True if a ccompat API answers GET subjects at base URL $1 (pure bash + curl, no JVM).
answers() { curl -sf -m 3 -o /dev/null "$1/subjects"; }

# pid of the registry this script started, or nothing (a stale pid file is removed: a pid
# reused by another program is not ours to stop).
registry_pid() {
  [ -f "$PIDFILE" ] || return 0
  local pid
  pid="$(cat "$PIDFILE" 2>/dev/null || true)"
  if [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null \
      && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'apicurio-registry-app'; then
    echo "$pid"
  else
    rm -f "$PIDFILE"
  fi
}

url_of() { echo "http://$HOST:$1$API"; }

fetch_app() {
  [ -f "$JAR" ] && [ -d "$APP/lib" ] && return 0
  command -v mvn >/dev/null || die "mvn not found on PATH (needed once to fetch the registry)"
  say "fetching $GAV with Maven into ${APP#"$ROOT"/} ..."
  local tmp out
  tmp="$(mktemp -d "$STATE/fetch.XXXXXX")"
  if ! out="$(mvn -q -B -Dstyle.color=never dependency:copy -Dartifact="$GAV" \
      -DoutputDirectory="$tmp" </dev/null 2>&1)"; then
    echo "$out" >&2; rm -rf "$tmp"
    die "maven could not fetch $GAV"
  fi
  # Unpacked beside, then moved: an interrupted fetch never leaves a half app in place.
  mkdir -p "$tmp/app"
  tar xzf "$tmp"/*.tar.gz -C "$tmp/app" || { rm -rf "$tmp"; die "could not unpack $GAV"; }
  rm -rf "$APP"
  mkdir -p "$(dirname "$APP")"
  mv "$tmp/app" "$APP"
  rm -rf "$tmp"
}

pick_port() {
  local p="${REGISTRY_PORT:-18081}" i
  if [ -n "${REGISTRY_PORT:-}" ]; then
    port_open "$HOST" "$p" && die "port $p (REGISTRY_PORT) is already in use"
    echo "$p"; return 0
  fi
  for i in $(seq 0 98); do
    if ! port_open "$HOST" $((p + i)); then
      [ "$i" -eq 0 ] || say "port $p busy, using $((p + i))"
      echo $((p + i)); return 0
    fi
  done
  die "no free port found from $p upward"
}

log_tail() { [ -f "$LOG" ] && tail -n 30 "$LOG" | sed 's/^/  | /' >&2 || true; }

stop_pid() { # $1 pid; TERM, then KILL after 30 s; fails if the process outlives both
  local pid="$1" i
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 300); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  say "pid $pid ignored SIGTERM for 30s; sending SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
  for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  return 1
}

cmd_start() {
  local t0 deadline pid port url
  t0="$(date +%s)"
  deadline=$((t0 + ${REGISTRY_START_TIMEOUT:-120}))
  if [ -n "${SCHEMA_REGISTRY_URL:-}" ]; then
    if answers "$SCHEMA_REGISTRY_URL"; then
      say "using the registry at SCHEMA_REGISTRY_URL"
      echo "SCHEMA_REGISTRY_URL=$SCHEMA_REGISTRY_URL"; return 0
    fi
    say "no registry answers at SCHEMA_REGISTRY_URL=$SCHEMA_REGISTRY_URL; starting a local one"
  fi
  mkdir -p "$STATE"
  exec 9>"$STATE/.lock"
  flock -w 150 9 || die "another registry.sh holds $STATE/.lock"

  pid="$(registry_pid)"
  if [ -n "$pid" ]; then
    port="$(cat "$PORTFILE" 2>/dev/null || true)"
    [[ "$port" =~ ^[0-9]+$ ]] || die "registry pid $pid runs but $PORTFILE has no port; run: $0 stop"
    url="$(url_of "$port")"
    while ! answers "$url"; do
      kill -0 "$pid" 2>/dev/null || die "registry pid $pid exited while starting (log: ${LOG#"$ROOT"/})"
      [ "$(date +%s)" -lt "$deadline" ] || die "registry pid $pid does not answer at $url; try: $0 stop"
      sleep 0.5
    done
    say "reusing the running registry (pid $pid)"
    echo "SCHEMA_REGISTRY_URL=$url"; return 0
  fi

  command -v java >/dev/null || die "java (17+) not found on PATH"
  port="$(pick_port)"
  fetch_app
  echo "$port" >"$PORTFILE"
  [ -f "$LOG" ] && mv -f "$LOG" "$LOG.old"
  # setsid: survive the caller's process group; close stdin, the lock fd and the caller's
  # stdout.  The app's default storage is in memory; it binds loopback only.  Without the
  # legacy id mode (the default, said explicitly) ccompat ids are content ids: the same
  # schema gets the same id, as Confluent's registry gives them.
  # shellcheck disable=SC2086
  setsid bash -c "$CLOSE_FDS"'echo $$ >"$1"; shift; exec "$@"' _ "$PIDFILE" \
    java ${REGISTRY_HEAP_OPTS:--Xms64m -Xmx384m} -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
    -XX:CICompilerCount=2 -Djava.awt.headless=true \
    -Dquarkus.http.host="$HOST" -Dquarkus.http.port="$port" \
    -Dregistry.ccompat.legacy-id-mode.enabled=false \
    -jar "$JAR" </dev/null >"$LOG" 2>&1 9>&- &
  for _ in $(seq 50); do [ -s "$PIDFILE" ] && break; sleep 0.1; done
  pid="$(cat "$PIDFILE" 2>/dev/null || true)"
  [ -n "$pid" ] || die "could not launch the registry"
  url="$(url_of "$port")"
  while ! answers "$url"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      say "registry exited during startup; log tail:"; log_tail; rm -f "$PIDFILE"
      die "the registry failed to start (log: ${LOG#"$ROOT"/})"
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
      say "registry not answering after timeout; log tail:"; log_tail
      stop_pid "$pid" && rm -f "$PIDFILE"
      die "the registry failed to start (log: ${LOG#"$ROOT"/})"
    fi
    sleep 0.5
  done
  say "ready (pid $pid) in $(( $(date +%s) - t0 ))s"
  echo "SCHEMA_REGISTRY_URL=$url"
}

cmd_stop() {
  local pid
  pid="$(registry_pid)"
  if [ -z "$pid" ]; then say "not running"; return 0; fi
  # The pid file stays when the process survives: a later stop must still find it.
  stop_pid "$pid" || die "pid $pid survived SIGKILL; $PIDFILE kept"
  rm -f "$PIDFILE"
  say "stopped (pid $pid)"
}

cmd_status() {
  local pid port
  pid="$(registry_pid)"
  if [ -z "$pid" ]; then echo "registry: stopped"; return 3; fi
  port="$(cat "$PORTFILE" 2>/dev/null || true)"
  if [[ "$port" =~ ^[0-9]+$ ]] && answers "$(url_of "$port")"; then
    echo "registry: running (pid $pid) at $(url_of "$port")"
  else
    echo "registry: process $pid alive but not answering on port ${port:-?}"
  fi
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *) echo "usage: $0 {start|stop|status}" >&2; exit 2 ;;
esac
