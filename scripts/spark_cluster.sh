#!/usr/bin/env bash
# A local Spark standalone cluster from the PySpark installation (the pip wheel ships the
# jars and bin/spark-class, not sbin/start-master.sh): one master and WORKERS workers, each
# its own JVM, one core each.
#
#   scripts/spark_cluster.sh start       start (or reuse); last stdout line: SPARK_MASTER=spark://host:port
#   scripts/spark_cluster.sh stop        stop what `start` started (idempotent)
#   scripts/spark_cluster.sh status      exit 0 when the master runs, 3 when not
#   scripts/spark_cluster.sh kill I      SIGKILL worker I (fault tests: only its recorded pid)
#   scripts/spark_cluster.sh restart I   start worker I again
#   scripts/spark_cluster.sh pid master|I
#
# Env: SPARK_MASTER_PORT (27077), WORKERS (2), SPARK_WORKER_MEMORY (1g: what executors of a
#      worker may take), SPARK_DAEMON_MEMORY (256m: each master/worker JVM),
#      SPARK_CLUSTER_STATE (.cache/spark-cluster), PYTHON (.venv/bin/python).
# Each worker runs in its own working directory (state/worker<I>/cwd) with its own work dir
# (state/worker<I>/work, where executors run) and a clean environment (no PYTHONPATH, no
# PYSPARK_PYTHON, no THESEUS_*): nothing the driver has is assumed on the executors' side.
# Web UIs bind ephemeral ports (port 0).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="${SPARK_CLUSTER_STATE:-$ROOT/.cache/spark-cluster}"
PORT="${SPARK_MASTER_PORT:-27077}"
WORKERS="${WORKERS:-2}"
HOST=127.0.0.1
PY="${PYTHON:-$ROOT/.venv/bin/python}"

# A daemon must not keep the caller's file descriptors: run under `flock LOCK make kafka`,
# it would otherwise hold LOCK for as long as it lives.
# shellcheck disable=SC2016
CLOSE_FDS='for fd in /proc/$$/fd/*; do fd=${fd##*/}; [ "$fd" -gt 2 ] && eval "exec $fd>&-"; done; '

say() { echo "spark-cluster: $*" >&2; }
die() { echo "spark-cluster: error: $*" >&2; exit 1; }

port_open() { timeout 2 bash -c ">/dev/tcp/$1/$2" 2>/dev/null; }

spark_home() {
  "$PY" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))' 2>/dev/null \
    || die "pyspark is not installed for $PY (run make test once, or set PYTHON)"
}

pid_of() { # $1 name (master | worker<I>): pid when its recorded process runs
  local f="$STATE/$1.pid" pid
  [ -f "$f" ] || return 0
  pid="$(cat "$f" 2>/dev/null || true)"
  if [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null \
      && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'org.apache.spark.deploy'; then
    echo "$pid"
  else
    rm -f "$f"
  fi
}

# Launch a daemon class in a clean environment from directory $2; $1 = name, rest = args.
launch() {
  local name="$1" dir="$2" home
  shift 2
  home="$(spark_home)"
  mkdir -p "$dir"
  [ -f "$STATE/$name.log" ] && mv -f "$STATE/$name.log" "$STATE/$name.log.old"
  # exec all the way down: no shell of this script stays alive holding the caller's stdout
  # (a caller reading it to its end, as subprocess.run does, would wait for the daemon)
  (
    cd "$dir" || exit 1
    exec setsid env -i PATH="/usr/bin:/bin:$(dirname "$(command -v java)")" \
      HOME="$HOME" SPARK_HOME="$home" SPARK_SCALA_VERSION=2.13 SPARK_LOCAL_IP="$HOST" \
      bash -c "$CLOSE_FDS"'echo $$ >"$1"; shift; exec "$@"' _ "$STATE/$name.pid" \
      java -Xms64m -Xmx"${SPARK_DAEMON_MEMORY:-256m}" -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
      -Dlog4j2.configurationFile="$STATE/log4j2.properties" \
      -cp "$home/conf:$home/jars/*" "$@"
  ) </dev/null >"$STATE/$name.log" 2>&1 &
  for _ in $(seq 50); do [ -s "$STATE/$name.pid" ] && break; sleep 0.1; done
}

start_worker() { # $1 index
  local i="$1"
  launch "worker$i" "$STATE/worker$i/cwd" org.apache.spark.deploy.worker.Worker \
    --host "$HOST" --cores 1 --memory "${SPARK_WORKER_MEMORY:-1g}" \
    --work-dir "$STATE/worker$i/work" --webui-port 0 "spark://$HOST:$PORT"
}

workers_registered() { # how many workers the master log says registered, minus removed ones
  local reg lost
  reg="$(grep -c 'Registering worker' "$STATE/master.log" 2>/dev/null || true)"
  lost="$(grep -c -E 'Removing worker|is now DEAD' "$STATE/master.log" 2>/dev/null || true)"
  echo $(( ${reg:-0} - ${lost:-0} ))
}

cmd_start() {
  command -v java >/dev/null || die "java (17+) not found on PATH"
  mkdir -p "$STATE"
  exec 9>"$STATE/.lock"
  flock -w 60 9 || die "another spark_cluster.sh holds $STATE/.lock"
  local t0 i
  t0="$(date +%s)"
  # The wheel has no conf/: without a log4j2 file the daemons log nothing, and whether the
  # workers registered is read from the master's log.
  cat >"$STATE/log4j2.properties" <<'EOF'
rootLogger.level = info
rootLogger.appenderRef.err.ref = err
appender.err.type = Console
appender.err.name = err
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = %d{HH:mm:ss.SSS} %p %c{1}: %m%n
EOF
  if [ -z "$(pid_of master)" ]; then
    port_open "$HOST" "$PORT" && die "port $PORT is in use (set SPARK_MASTER_PORT)"
    launch master "$STATE/master" org.apache.spark.deploy.master.Master \
      --host "$HOST" --port "$PORT" --webui-port 0
    for _ in $(seq 300); do port_open "$HOST" "$PORT" && break; sleep 0.2; done
    port_open "$HOST" "$PORT" || { tail -n 20 "$STATE/master.log" >&2; die "master did not start"; }
  fi
  for i in $(seq "$WORKERS"); do
    [ -n "$(pid_of "worker$i")" ] || start_worker "$i"
  done
  for _ in $(seq 300); do
    [ "$(workers_registered)" -ge "$WORKERS" ] && break
    sleep 0.2
  done
  [ "$(workers_registered)" -ge "$WORKERS" ] || { tail -n 20 "$STATE"/worker*.log >&2; die "workers did not register"; }
  say "master + $WORKERS worker(s) up in $(( $(date +%s) - t0 ))s (logs in ${STATE#"$ROOT"/})"
  echo "SPARK_MASTER=spark://$HOST:$PORT"
}

stop_pid() {
  local pid="$1"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
}

cmd_stop() {
  local n pid any=0
  for n in $(cd "$STATE" 2>/dev/null && ls ./*.pid 2>/dev/null | sed 's|^\./||; s|\.pid$||'); do
    pid="$(pid_of "$n")"
    [ -n "$pid" ] && { stop_pid "$pid"; any=1; }
    rm -f "$STATE/$n.pid"
  done
  if [ "$any" -eq 1 ]; then say "stopped"; else say "not running"; fi
}

cmd_status() {
  local pid
  pid="$(pid_of master)"
  [ -n "$pid" ] || { echo "spark-cluster: stopped"; return 3; }
  echo "spark-cluster: master pid $pid at spark://$HOST:$PORT"
  for n in $(cd "$STATE" && ls worker*.pid 2>/dev/null | sed 's|\.pid$||'); do
    echo "spark-cluster: $n pid $(pid_of "$n")"
  done
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  kill) pid="$(pid_of "worker${2:-}")"; [ -n "$pid" ] || die "worker ${2:-} does not run"
        kill -KILL "$pid"; rm -f "$STATE/worker$2.pid"; say "killed worker $2 (pid $pid)" ;;
  restart) [ -z "$(pid_of "worker${2:-}")" ] || die "worker ${2:-} runs"; start_worker "$2"
           say "worker $2 started" ;;
  pid) if [ "${2:-}" = master ]; then pid_of master; else pid_of "worker${2:-}"; fi ;;
  *) echo "usage: $0 {start|stop|status|kill I|restart I|pid master|I}" >&2; exit 2 ;;
esac
