#!/usr/bin/env bash
# A local Spark standalone cluster from the PySpark installation (the pip wheel ships the
# jars and bin/spark-class, not sbin/start-master.sh): one master and WORKERS workers, each
# its own JVM, one core each.
#
#   scripts/spark_cluster.sh start       start (or reuse); last stdout line: SPARK_MASTER=spark://host:port
#                                        Safe to run again: it starts only the daemons that are
#                                        down (a master on the port the running workers know)
#                                        and never stops a running one.
#   scripts/spark_cluster.sh stop        stop what `start` started (idempotent); exits 1, naming
#                                        it and keeping its pid file, when a daemon does not stop
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
# A daemon is recognised by the state path on its command line: keep it absolute.
case "$STATE" in /*) ;; *) STATE="$PWD/$STATE" ;; esac
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

# True while process $1 exists and is not a zombie. Not `kill -0`: that fails for another
# user's process, which still runs.
proc_alive() {
  local st
  st="$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "/proc/$1/status" 2>/dev/null || true)"
  [ -n "$st" ] && [ "$st" != Z ]
}

# True if process $1 is this state's daemon $2 (master | worker<I>): its class, this state's
# log configuration and, for a worker, its own work directory on the command line.
is_daemon() {
  local args
  args="$(tr '\0' '\n' <"/proc/$1/cmdline" 2>/dev/null || true)"
  grep -qxF -- "-Dlog4j2.configurationFile=$STATE/log4j2.properties" <<<"$args" || return 1
  case "$2" in
    master) grep -qxF org.apache.spark.deploy.master.Master <<<"$args" ;;
    *) grep -qxF org.apache.spark.deploy.worker.Worker <<<"$args" \
         && grep -qxF -- "$STATE/$2/work" <<<"$args" ;;
  esac
}

pid_of() { # $1 name (master | worker<I>): pid when it runs (a daemon without its pid file
           # gets it back, so that start does not launch it twice nor stop forget it)
  local f="$STATE/$1.pid" pid c
  if [ -f "$f" ]; then
    pid="$(cat "$f" 2>/dev/null || true)"
    if [[ "$pid" =~ ^[0-9]+$ ]] && proc_alive "$pid" && is_daemon "$pid" "$1"; then
      echo "$pid"; return 0
    fi
    rm -f "$f"
  fi
  for c in $(grep -lzxF -- "-Dlog4j2.configurationFile=$STATE/log4j2.properties" \
      /proc/[0-9]*/cmdline 2>/dev/null || true); do
    pid="${c#/proc/}"; pid="${pid%/cmdline}"
    if proc_alive "$pid" && is_daemon "$pid" "$1"; then
      echo "$pid" >"$f"
      say "$1 runs as pid $pid without its pid file; recorded it again"
      echo "$pid"; return 0
    fi
  done
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

worker_registered() { # $1 index: its log says the master took it
  grep -q 'Successfully registered with master' "$STATE/worker$1.log" 2>/dev/null
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
  local t0 i ready=1
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
  # The running workers know the master by its port: a master started again must use it.
  if [ -f "$STATE/master.port" ] && { [ -n "$(pid_of master)" ] \
      || [ -n "$(running_workers)" ]; }; then
    local was
    was="$(cat "$STATE/master.port")"
    [ -z "${SPARK_MASTER_PORT:-}" ] || [ "$SPARK_MASTER_PORT" = "$was" ] || die "the running" \
      "cluster's master port is $was, not SPARK_MASTER_PORT=$SPARK_MASTER_PORT; unset it or run:" \
      "$0 stop"
    PORT="$was"
  fi
  local master_started=0 launched=()
  if [ -z "$(pid_of master)" ]; then
    port_open "$HOST" "$PORT" && die "port $PORT is in use (set SPARK_MASTER_PORT)"
    launch master "$STATE/master" org.apache.spark.deploy.master.Master \
      --host "$HOST" --port "$PORT" --webui-port 0
    echo "$PORT" >"$STATE/master.port"
    master_started=1
    for _ in $(seq 300); do port_open "$HOST" "$PORT" && break; sleep 0.2; done
    port_open "$HOST" "$PORT" || { tail -n 20 "$STATE/master.log" >&2; die "master did not start"; }
  fi
  for i in $(seq "$WORKERS"); do
    [ -n "$(pid_of "worker$i")" ] || { start_worker "$i"; launched+=("$i"); }
  done
  # a worker started now says so in its own log; a master started now counts the workers
  # (live ones re-register with it) in its log
  for _ in $(seq 300); do
    ready=1
    for i in "${launched[@]}"; do worker_registered "$i" || ready=0; done
    [ "$master_started" -eq 0 ] || [ "$(workers_registered)" -ge "$WORKERS" ] || ready=0
    [ "$ready" -eq 0 ] || break
    sleep 0.2
  done
  [ "$ready" -eq 1 ] || { tail -n 20 "$STATE"/worker*.log >&2; die "workers did not register"; }
  if [ "$master_started" -eq 0 ] && [ "${#launched[@]}" -eq 0 ]; then
    say "reusing the running master + $WORKERS worker(s)"
  elif [ "$master_started" -eq 0 ]; then
    say "worker(s) ${launched[*]} were down: started again; the others kept running"
  else
    say "master + $WORKERS worker(s) up in $(( $(date +%s) - t0 ))s (logs in ${STATE#"$ROOT"/})"
  fi
  echo "SPARK_MASTER=spark://$HOST:$PORT"
}

running_workers() {
  local n
  for n in $(cd "$STATE" 2>/dev/null && ls worker*.pid 2>/dev/null | sed 's|\.pid$||'); do
    pid_of "$n"
  done
}

# Stop the daemons named: SIGTERM, SIGKILL after SPARK_STOP_TIMEOUT (10 s). A pid file goes
# only with its process: one that survives (another user's, or one the kernel will not kill
# yet) is named, its pid file kept, and the return status is 1.
stop_daemons() {
  local n pid left why names=() pids=() stuck=()
  for n in "$@"; do
    pid="$(pid_of "$n")"
    [ -n "$pid" ] || continue
    names+=("$n"); pids+=("$pid")
    kill -TERM "$pid" 2>/dev/null || true
  done
  left=$(( ${SPARK_STOP_TIMEOUT:-10} * 10 ))
  for n in "${!pids[@]}"; do
    pid="${pids[$n]}"
    # a process we may not signal (another user's) will not go: no use waiting for it
    while proc_alive "$pid" && kill -0 "$pid" 2>/dev/null && [ "$left" -gt 0 ]; do
      sleep 0.1; left=$((left - 1))
    done
    proc_alive "$pid" && kill -KILL "$pid" 2>/dev/null || true
  done
  for n in "${!pids[@]}"; do
    pid="${pids[$n]}"
    for _ in $(seq 50); do
      proc_alive "$pid" && kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if proc_alive "$pid"; then
      stuck+=("${names[$n]}")
      if kill -0 "$pid" 2>/dev/null; then why="survived SIGTERM and SIGKILL"
      else why="may not be signalled by $(id -un)"; fi
      say "${names[$n]} (pid $pid) did not stop: it $why; its pid file" \
        "${STATE#"$ROOT"/}/${names[$n]}.pid is kept"
    else
      rm -f "$STATE/${names[$n]}.pid"
    fi
  done
  if [ "${#pids[@]}" -eq 0 ]; then say "not running"
  elif [ "${#stuck[@]}" -lt "${#pids[@]}" ]; then say "stopped"; fi
  if [ "${#stuck[@]}" -gt 0 ]; then
    echo "spark-cluster: error: could not stop ${stuck[*]}" >&2
    return 1
  fi
}

cmd_stop() {
  local names
  # shellcheck disable=SC2012
  names="$(cd "$STATE" 2>/dev/null && ls ./*.pid 2>/dev/null | sed 's|^\./||; s|\.pid$||' || true)"
  # a daemon whose pid file is gone is found by its command line
  for n in master $(seq -f 'worker%g' "$WORKERS"); do
    grep -qxF "$n" <<<"$names" || names="$names"$'\n'"$n"
  done
  # shellcheck disable=SC2046
  stop_daemons $(grep . <<<"$names" | sort -u)
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

# One spark_cluster.sh at a time changes the state directory (cmd_start locks for itself).
case "${1:-}" in
  stop | kill | restart) mkdir -p "$STATE"; exec 9>"$STATE/.lock"
    flock -w 60 9 || die "another spark_cluster.sh holds $STATE/.lock" ;;
esac
case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  kill) pid="$(pid_of "worker${2:-}")"; [ -n "$pid" ] || die "worker ${2:-} does not run"
        kill -KILL "$pid"
        for _ in $(seq 100); do proc_alive "$pid" || break; sleep 0.05; done
        proc_alive "$pid" && die "worker $2 (pid $pid) is still there after SIGKILL; its pid" \
          "file is kept"
        rm -f "$STATE/worker$2.pid"; say "killed worker $2 (pid $pid)" ;;
  restart) [ -z "$(pid_of "worker${2:-}")" ] || die "worker ${2:-} runs"; start_worker "$2"
           say "worker $2 started" ;;
  pid) if [ "${2:-}" = master ]; then pid_of master; else pid_of "worker${2:-}"; fi ;;
  *) echo "usage: $0 {start|stop|status|kill I|restart I|pid master|I}" >&2; exit 2 ;;
esac
