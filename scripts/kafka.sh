#!/usr/bin/env bash
# Local Apache Kafka (KRaft, combined broker+controller nodes) from Maven Central jars.
#
#   scripts/kafka.sh start      start (or reuse) the cluster; last stdout line:
#                               KAFKA_BOOTSTRAP=host:port[,host:port...]
#                               Safe to run again: when some node runs, it starts only the
#                               nodes that are down, each on its own data, properties and
#                               ports; it never stops, rewrites or reformats a running node.
#   scripts/kafka.sh stop       stop the nodes started by `start` (idempotent); exits 1, naming
#                               it and keeping its pid file, when a node does not stop
#   scripts/kafka.sh status     say whether it runs (exit 0 running, 3 stopped)
#   scripts/kafka.sh reset      stop it and delete its data (jars stay cached)
#   scripts/kafka.sh kill I     SIGKILL node I (fault tests: only the pid this script started)
#   scripts/kafka.sh restart I  start node I again on its data (after `kill I`)
#   scripts/kafka.sh pid I      the pid of node I (nothing when it does not run)
#   scripts/kafka.sh run CLASS [ARGS...]
#                               run a Kafka tool class with the cached jars, e.g.
#                               run org.apache.kafka.tools.TopicCommand --bootstrap-server 127.0.0.1:19092 --list
#
# Env: KAFKA_BOOTSTRAP (use that broker if it answers), BROKERS (1; 3 starts a three-node
#      cluster: default.replication.factor=3, min.insync.replicas=2, internal topics RF 3),
#      KAFKA_PORT (19092 for one broker, 29092 for several: node I listens on KAFKA_PORT+I-1),
#      KAFKA_CONTROLLER_PORT (19093; 29100 for several), KAFKA_START_TIMEOUT (90 s),
#      KAFKA_HEAP_OPTS (-Xms256m -Xmx512m; -Xms128m -Xmx384m per node when several),
#      KAFKA_STATE (the state directory: .cache/kafka for one broker, .cache/kafka-<N> for N),
#      KAFKA_STOP_TIMEOUT (30 s of SIGTERM before SIGKILL),
#      KAFKA_SASL_USERS ("admin=pw,alice=pw,..."): the client listener is SASL_PLAINTEXT with
#      SCRAM-SHA-512 users created at format time, and the StandardAuthorizer; the first user
#      is the super user (this script's tools log in as it, with $KAFKA_STATE/admin.properties).
# Jars live in .cache/kafka/libs/ (shared); each node has data/, server.properties, kafka.pid
# and kafka.log in the state directory (in node<I>/ when there are several).
# Progress goes to stderr; only the KAFKA_BOOTSTRAP= line goes to stdout.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
POM="$ROOT/scripts/kafka/pom.xml"
N="${BROKERS:-1}"
[[ "$N" =~ ^[1-9]$ ]] || { echo "kafka: error: BROKERS must be 1..9, not '$N'" >&2; exit 2; }
if [ "$N" -eq 1 ]; then
  STATE="${KAFKA_STATE:-$ROOT/.cache/kafka}"
else
  STATE="${KAFKA_STATE:-$ROOT/.cache/kafka-$N}"
fi
# A node is recognised by the properties path on its command line: keep it absolute.
case "$STATE" in /*) ;; *) STATE="$PWD/$STATE" ;; esac
LIBS="$ROOT/.cache/kafka/libs"
HOST=127.0.0.1
SASL_USERS="${KAFKA_SASL_USERS:-}"
ADMIN_PROPS="$STATE/admin.properties"

# A daemon must not keep the caller's file descriptors: run under `flock LOCK make kafka`,
# it would otherwise hold LOCK for as long as it lives.
# shellcheck disable=SC2016
CLOSE_FDS='for fd in /proc/$$/fd/*; do fd=${fd##*/}; [ "$fd" -gt 2 ] && eval "exec $fd>&-"; done; '

say() { echo "kafka: $*" >&2; }
die() { echo "kafka: error: $*" >&2; exit 1; }

# Per-node paths; a single broker keeps the historical layout (everything in $STATE).
node_dir() { if [ "$N" -eq 1 ]; then echo "$STATE"; else echo "$STATE/node$1"; fi; }
select_node() {  # sets SELECTED DATA PROPS PIDFILE LOG for node $1
  local d
  SELECTED="$1"
  d="$(node_dir "$1")"
  DATA="$d/data"; PROPS="$d/server.properties"; PIDFILE="$d/kafka.pid"; LOG="$d/kafka.log"
}
select_node 1

# True if something accepts TCP connections on $1:$2.
port_open() { timeout 2 bash -c ">/dev/tcp/$1/$2" 2>/dev/null; }

# True if a Kafka broker answers an ApiVersions request (v0) on $1:$2; pure bash, no JVM.
# (ApiVersions is answered before SASL authentication too.)
kafka_answers() {
  [[ "${2:-}" =~ ^[0-9]+$ ]] || return 1
  timeout 3 bash -c '
    exec 3<>"/dev/tcp/$1/$2" || exit 1
    printf "\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x07\xff\xff" >&3
    resp="$(head -c 8 <&3 | od -An -tx1 | tr -d " \n")"
    [ "${resp:8:8}" = "00000007" ]
  ' _ "$1" "$2" 2>/dev/null
}

# True while process $1 exists and is not a zombie (a zombie holds no port and no file).
# Not `kill -0`: that fails for another user's process, which still runs.
proc_alive() {
  local st
  st="$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "/proc/$1/status" 2>/dev/null || true)"
  [ -n "$st" ] && [ "$st" != Z ]
}

# True if process $1 is the selected node's broker: kafka.Kafka run on its properties file.
is_node_proc() {
  local args
  args="$(tr '\0' '\n' <"/proc/$1/cmdline" 2>/dev/null || true)"
  grep -qxF 'kafka.Kafka' <<<"$args" && grep -qxF "$PROPS" <<<"$args"
}

# pid of the selected node, or nothing. A stale pid file (its process gone, or the pid reused
# by another program) is removed; a node running without its pid file gets it back, so that
# neither start launches it twice nor stop forgets it.
broker_pid() {
  local pid f
  if [ -f "$PIDFILE" ]; then
    pid="$(cat "$PIDFILE" 2>/dev/null || true)"
    if [[ "$pid" =~ ^[0-9]+$ ]] && proc_alive "$pid" && is_node_proc "$pid"; then
      echo "$pid"; return 0
    fi
    rm -f "$PIDFILE"
  fi
  for f in $(grep -lzxF -- "$PROPS" /proc/[0-9]*/cmdline 2>/dev/null || true); do
    pid="${f#/proc/}"; pid="${pid%/cmdline}"
    if proc_alive "$pid" && is_node_proc "$pid"; then
      [ -d "$(dirname "$PIDFILE")" ] && echo "$pid" >"$PIDFILE"
      say "node $SELECTED runs as pid $pid without its pid file; recorded it again"
      echo "$pid"; return 0
    fi
  done
}

# Client port recorded in the selected node's server.properties.
configured_port() {
  sed -n 's|^advertised.listeners=[A-Z_]*://[^:]*:\([0-9]*\).*|\1|p' "$PROPS" 2>/dev/null || true
}

# Controller port recorded in the selected node's server.properties.
configured_cport() {
  sed -n 's|^listeners=.*CONTROLLER://[^:]*:\([0-9]*\).*|\1|p' "$PROPS" 2>/dev/null || true
}

# host:port of every node, comma-separated.
bootstrap_list() {
  local i out=""
  for i in $(seq "$N"); do
    select_node "$i"
    out="${out:+$out,}$HOST:$(configured_port)"
  done
  select_node 1
  echo "$out"
}

need_java() { command -v java >/dev/null || die "java (17+) not found on PATH"; }

fetch_jars() {
  local sum
  sum="$(sha256sum "$POM" | cut -d' ' -f1)"
  if [ -f "$LIBS/.pom.sha256" ] && [ "$(cat "$LIBS/.pom.sha256")" = "$sum" ]; then
    return 0
  fi
  command -v mvn >/dev/null || die "mvn not found on PATH (needed once to fetch Kafka jars)"
  say "fetching Kafka jars with Maven into ${LIBS#"$ROOT"/} ..."
  rm -rf "$LIBS"
  local out
  if ! out="$(mvn -q -B -Dstyle.color=never -f "$POM" dependency:copy-dependencies \
      -DoutputDirectory="$LIBS" </dev/null 2>&1)"; then
    echo "$out" >&2
    die "maven could not fetch the Kafka jars"
  fi
  echo "$sum" >"$LIBS/.pom.sha256"
}

write_log4j() {
  cat >"$STATE/log4j2.properties" <<'EOF'
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = OUT
logger.state.name = state.change.logger
logger.state.level = warn
logger.request.name = kafka.request.logger
logger.request.level = warn
EOF
  cat >"$STATE/tools-log4j2.properties" <<'EOF'
status = warn
appender.err.type = Console
appender.err.name = ERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.err.ref = ERR
EOF
}

# Run a Kafka tool class with the cached jars (quiet logging to stderr).
run_tool() {
  need_java
  [ -f "$STATE/tools-log4j2.properties" ] || { mkdir -p "$STATE"; write_log4j; }
  java -Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC \
    -Dlog4j2.configurationFile="$STATE/tools-log4j2.properties" \
    -cp "$LIBS/*" "$@"
}

first_user() { local u="${SASL_USERS%%,*}"; echo "${u%%=*}"; }
first_pass() { local u="${SASL_USERS%%,*}"; echo "${u#*=}"; }

write_props() { # $1 node id, $2 client port, $3 controller port, $4 quorum voters
  local rf=1 isr=1 listener=PLAINTEXT
  if [ "$N" -ge 3 ]; then rf=3; isr=2; elif [ "$N" -eq 2 ]; then rf=2; fi
  [ -n "$SASL_USERS" ] && listener=SASL_PLAINTEXT
  mkdir -p "$(dirname "$PROPS")"
  cat >"$PROPS" <<EOF
# Generated by scripts/kafka.sh; rewritten on every fresh start.
process.roles=broker,controller
node.id=$1
controller.quorum.voters=$4
listeners=$listener://$HOST:$2,CONTROLLER://$HOST:$3
advertised.listeners=$listener://$HOST:$2
listener.security.protocol.map=$listener:$listener,CONTROLLER:PLAINTEXT
inter.broker.listener.name=$listener
controller.listener.names=CONTROLLER
log.dirs=$DATA
num.partitions=1
auto.create.topics.enable=false
default.replication.factor=$rf
min.insync.replicas=$isr
offsets.topic.replication.factor=$rf
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
share.coordinator.state.topic.replication.factor=$rf
share.coordinator.state.topic.min.isr=$isr
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
EOF
  if [ -n "$SASL_USERS" ]; then
    # SCRAM users are created at format time (--add-scram). The controller listener stays
    # PLAINTEXT on loopback: its principal (ANONYMOUS: the nodes themselves) is a super user
    # beside the admin user.
    cat >>"$PROPS" <<EOF
sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="$(first_user)" password="$(first_pass)";
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:$(first_user);User:ANONYMOUS
allow.everyone.if.no.acl.found=false
EOF
  fi
}

write_admin_props() {
  if [ -n "$SASL_USERS" ]; then
    cat >"$ADMIN_PROPS" <<EOF
security.protocol=SASL_PLAINTEXT
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="$(first_user)" password="$(first_pass)";
EOF
  else
    : >"$ADMIN_PROPS"
  fi
}

# The base client and controller ports: env overrides must be free; defaults move up if taken.
pick_ports() {
  local p c i j busy
  if [ "$N" -eq 1 ]; then p="${KAFKA_PORT:-19092}"; c="${KAFKA_CONTROLLER_PORT:-19093}"
  else p="${KAFKA_PORT:-29092}"; c="${KAFKA_CONTROLLER_PORT:-29100}"; fi
  if [ -n "${KAFKA_PORT:-}" ] || [ -n "${KAFKA_CONTROLLER_PORT:-}" ]; then
    for j in $(seq 0 $((N - 1))); do
      port_open "$HOST" $((p + j)) && die "port $((p + j)) (KAFKA_PORT+$j) is already in use"
      port_open "$HOST" $((c + j)) && die "port $((c + j)) (KAFKA_CONTROLLER_PORT+$j) is already in use"
    done
    echo "$p $c"; return 0
  fi
  for i in $(seq 0 $((2 * N)) 98); do
    busy=0
    for j in $(seq 0 $((N - 1))); do
      if port_open "$HOST" $((p + i + j)) || port_open "$HOST" $((c + i + j)); then busy=1; fi
    done
    if [ "$busy" -eq 0 ]; then
      [ "$i" -eq 0 ] || say "ports $p/$c busy, using $((p + i))/$((c + i))"
      echo "$((p + i)) $((c + i))"; return 0
    fi
  done
  die "no free port range found from $p upward"
}

log_tail() { [ -f "$LOG" ] && tail -n 40 "$LOG" | sed 's/^/  | /' >&2 || true; }

# Wait until the cluster serves metadata through node $2's port (node pid $1; deadline $3).
wait_ready() {
  local pid="$1" port="$2" deadline="$3" left
  while ! port_open "$HOST" "$port"; do
    kill -0 "$pid" 2>/dev/null || { say "node exited during startup; log tail:"; log_tail; return 1; }
    [ "$(date +%s)" -lt "$deadline" ] || { say "node not listening after timeout; log tail:"; log_tail; return 1; }
    sleep 0.3
  done
  # Real metadata round trip through the admin client.
  while :; do
    left=$((deadline - $(date +%s)))
    [ "$left" -gt 0 ] || { say "node does not answer metadata requests; log tail:"; log_tail; return 1; }
    if timeout "$left" java -Xmx128m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC \
        -Dlog4j2.configurationFile="$STATE/tools-log4j2.properties" -cp "$LIBS/*" \
        org.apache.kafka.tools.TopicCommand --bootstrap-server "$HOST:$port" \
        --command-config "$ADMIN_PROPS" --list >/dev/null 2>&1; then
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || { say "node exited during startup; log tail:"; log_tail; return 1; }
    sleep 1
  done
}

# Launch the selected node's JVM in the background (its own session); prints its pid.
launch_node() {
  local heap="${KAFKA_HEAP_OPTS:-}"
  [ -n "$heap" ] || { if [ "$N" -eq 1 ]; then heap="-Xms256m -Xmx512m"; else heap="-Xms128m -Xmx384m"; fi; }
  [ -f "$LOG" ] && mv -f "$LOG" "$LOG.old"
  rm -f "$PIDFILE"
  # setsid: survive the caller's process group; close stdin, the lock fd and the caller's stdout.
  # shellcheck disable=SC2086
  setsid bash -c "$CLOSE_FDS"'echo $$ >"$1"; shift; exec "$@"' _ "$PIDFILE" \
    java $heap -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:CICompilerCount=2 \
    -Djava.awt.headless=true -Dlog4j2.configurationFile="$STATE/log4j2.properties" \
    -cp "$LIBS/*" kafka.Kafka "$PROPS" </dev/null >"$LOG" 2>&1 9>&- &
  for _ in $(seq 50); do [ -s "$PIDFILE" ] && break; sleep 0.1; done
  cat "$PIDFILE" 2>/dev/null || true
}

# The nodes of the cluster in $STATE that run now and those that do not (node numbers).
survey() {
  local i
  RUNNING=(); DOWN=(); RUNNING_PIDS=()
  for i in $(seq "$N"); do
    select_node "$i"
    pid="$(broker_pid)"
    if [ -n "$pid" ]; then RUNNING+=("$i"); RUNNING_PIDS+=("$pid"); else DOWN+=("$i"); fi
  done
  select_node 1
}

# Some node runs: start the others on their own data and properties, nothing else. Fresh
# ports or rewritten properties would split the quorum the running nodes hold (voters are
# host:port), and a second JVM on a live node's data would corrupt it.
start_down_nodes() {
  local deadline="$1" i pid port cport want launched=() lpids=()
  for i in "${DOWN[@]}"; do
    select_node "$i"
    [ -f "$PROPS" ] && [ -f "$DATA/meta.properties" ] || die "node $i is down and has no" \
      "properties or data under ${STATE#"$ROOT"/} while node(s) ${RUNNING[*]} run: this" \
      "state is not one cluster; run: $0 stop, then $0 reset"
  done
  for i in $(seq "$N"); do
    select_node "$i"
    port="$(configured_port)"; cport="$(configured_cport)"
    [ -n "$port" ] && [ -n "$cport" ] || die "$PROPS names no client or controller port"
    if [ -n "${KAFKA_PORT:-}" ] && [ "$port" != $((KAFKA_PORT + i - 1)) ]; then
      die "node $i of the running cluster listens on $port, not KAFKA_PORT+$((i - 1))" \
        "= $((KAFKA_PORT + i - 1)); unset KAFKA_PORT, or run: $0 stop first"
    fi
  done
  for i in "${DOWN[@]}"; do
    select_node "$i"
    port="$(configured_port)"; cport="$(configured_cport)"
    for want in "$port" "$cport"; do
      port_open "$HOST" "$want" && die "node $i is down but its port $want (from $PROPS)" \
        "is taken by another process; free it, then run: $0 restart $i"
    done
  done
  need_java
  fetch_jars
  for i in "${DOWN[@]}"; do
    select_node "$i"
    say "node $i is down: starting it again on its data (port $(configured_port))"
    pid="$(launch_node)"
    [ -n "$pid" ] || die "could not launch node $i"
    launched+=("$i"); lpids+=("$pid")
  done
  for i in "${!launched[@]}"; do
    select_node "${launched[$i]}"
    if ! wait_ready "${lpids[$i]}" "$(configured_port)" "$deadline"; then
      stop_nodes "${launched[@]}" >/dev/null 2>&1 || true
      die "node ${launched[$i]} failed to start again (log: ${LOG#"$ROOT"/}); the running" \
        "node(s) ${RUNNING[*]} were left as they were"
    fi
  done
  select_node 1
  say "node(s) ${launched[*]} back (pids ${lpids[*]}); node(s) ${RUNNING[*]} kept running" \
    "(pids ${RUNNING_PIDS[*]})"
}

cmd_start() {
  local t0 deadline pid port cport id i voters="" pids=()
  t0="$(date +%s)"
  deadline=$((t0 + ${KAFKA_START_TIMEOUT:-90}))

  if [ -n "${KAFKA_BOOTSTRAP:-}" ]; then
    local first="${KAFKA_BOOTSTRAP%%,*}"
    if kafka_answers "${first%:*}" "${first##*:}"; then
      say "using broker from KAFKA_BOOTSTRAP"
      local given; given=$(echo "$KAFKA_BOOTSTRAP" | tr ',' '\n' | grep -c .)
      [ "$N" -le 1 ] || [ "$given" -ge "$N" ] || say "warning: BROKERS=$N asked, but" \
        "KAFKA_BOOTSTRAP names $given broker(s): that cluster is used as it is"
      echo "KAFKA_BOOTSTRAP=$KAFKA_BOOTSTRAP"; return 0
    fi
    say "no broker answers at KAFKA_BOOTSTRAP=$KAFKA_BOOTSTRAP; starting a local one"
  fi

  take_lock
  survey
  if [ "${#RUNNING[@]}" -gt 0 ]; then
    [ "${#DOWN[@]}" -eq 0 ] || start_down_nodes "$deadline"
    for i in $(seq "$N"); do
      select_node "$i"
      pid="$(broker_pid)"
      [ -n "$pid" ] || die "node $i stopped while starting; see ${LOG#"$ROOT"/}"
      port="$(configured_port)"
      if ! kafka_answers "$HOST" "$port"; then
        say "node $i (pid $pid) is running but not answering yet; waiting"
        need_java
        wait_ready "$pid" "$port" "$deadline" || die "node $i (pid $pid) is not healthy; try: $0 stop"
      fi
    done
    [ "${#DOWN[@]}" -gt 0 ] || say "reusing the running cluster ($N node(s))"
    echo "KAFKA_BOOTSTRAP=$(bootstrap_list)"; return 0
  fi

  need_java
  fetch_jars
  write_log4j
  write_admin_props
  read -r port cport < <(pick_ports)
  for i in $(seq "$N"); do voters="${voters:+$voters,}$i@$HOST:$((cport + i - 1))"; done
  for i in $(seq "$N"); do
    select_node "$i"
    write_props "$i" $((port + i - 1)) $((cport + i - 1)) "$voters"
  done

  select_node 1
  if [ ! -f "$DATA/meta.properties" ]; then
    # Random 16-byte cluster id, base64url without padding (what `random-uuid` prints).
    id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')"
    id="A${id:1}"  # never starts with '-'
    local scram=()
    if [ -n "$SASL_USERS" ]; then
      local u
      IFS=',' read -ra users <<<"$SASL_USERS"
      for u in "${users[@]}"; do
        scram+=(--add-scram "SCRAM-SHA-512=[name=${u%%=*},password=${u#*=}]")
      done
    fi
    for i in $(seq "$N"); do
      select_node "$i"
      mkdir -p "$DATA"
      run_tool kafka.tools.StorageTool format -t "$id" -c "$PROPS" "${scram[@]}" >/dev/null \
        || die "storage format of node $i failed"
    done
    say "formatted $N node(s) under ${STATE#"$ROOT"/} (cluster id $id)"
  fi

  for i in $(seq "$N"); do
    select_node "$i"
    pid="$(launch_node)"
    [ -n "$pid" ] || { stop_nodes $(seq $((i - 1))) >/dev/null 2>&1 || true; die "could not launch node $i"; }
    pids+=("$pid")
  done
  for i in $(seq "$N"); do
    select_node "$i"
    if ! wait_ready "${pids[$((i - 1))]}" $((port + i - 1)) "$deadline"; then
      # every node was launched by this call (none ran before): stopping them stops only ours
      stop_nodes $(seq "$N") >/dev/null 2>&1 || true
      die "node $i failed to start (log: ${LOG#"$ROOT"/})"
    fi
  done
  say "$N node(s) ready (pids ${pids[*]}) in $(( $(date +%s) - t0 ))s"
  echo "KAFKA_BOOTSTRAP=$(bootstrap_list)"
}

# Stop the given nodes: SIGTERM together (a controller quorum stops faster when all go at
# once), SIGKILL after KAFKA_STOP_TIMEOUT. A node's pid file goes only with its process: a
# process that survives (another user's, or one the kernel will not kill yet) is named, its
# pid file kept, and the return status is 1.
stop_nodes() {
  local i pid n left why pids=() nodes=() stuck=() stopped=()
  for i in "$@"; do
    select_node "$i"
    pid="$(broker_pid)"
    [ -n "$pid" ] || { rm -f "$PIDFILE"; continue; }
    nodes+=("$i"); pids+=("$pid")
    kill -TERM "$pid" 2>/dev/null || true
  done
  left=$(( ${KAFKA_STOP_TIMEOUT:-30} * 10 ))
  for n in "${!pids[@]}"; do
    # a process we may not signal (another user's) will not go: no use waiting for it
    while proc_alive "${pids[$n]}" && kill -0 "${pids[$n]}" 2>/dev/null && [ "$left" -gt 0 ]; do
      sleep 0.1; left=$((left - 1))
    done
  done
  for n in "${!pids[@]}"; do
    pid="${pids[$n]}"
    if proc_alive "$pid" && kill -0 "$pid" 2>/dev/null; then
      say "node ${nodes[$n]} (pid $pid) ignored SIGTERM for ${KAFKA_STOP_TIMEOUT:-30}s; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  for n in "${!pids[@]}"; do
    pid="${pids[$n]}"
    for _ in $(seq 50); do
      proc_alive "$pid" && kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    select_node "${nodes[$n]}"
    if proc_alive "$pid"; then
      stuck+=("${nodes[$n]}")
      if kill -0 "$pid" 2>/dev/null; then why="survived SIGTERM and SIGKILL"
      else why="may not be signalled by $(id -un)"; fi
      say "node ${nodes[$n]} (pid $pid) did not stop: it $why; its pid file" \
        "${PIDFILE#"$ROOT"/} is kept"
    else
      rm -f "$PIDFILE"; stopped+=("$pid")
    fi
  done
  select_node 1
  [ "${#stopped[@]}" -eq 0 ] || say "stopped (pids ${stopped[*]})"
  [ "${#pids[@]}" -gt 0 ] || say "not running"
  if [ "${#stuck[@]}" -gt 0 ]; then
    echo "kafka: error: could not stop node(s) ${stuck[*]}" >&2
    return 1
  fi
}

cmd_stop() { stop_nodes $(seq "$N"); }

node_arg() {
  [[ "${1:-}" =~ ^[1-9]$ ]] && [ "$1" -le "$N" ] || die "node must be 1..$N, not '${1:-}'"
}

cmd_kill() {
  node_arg "${1:-}"
  select_node "$1"
  local pid
  pid="$(broker_pid)"
  [ -n "$pid" ] || die "node $1 does not run"
  kill -KILL "$pid"
  for _ in $(seq 100); do proc_alive "$pid" || break; sleep 0.05; done
  proc_alive "$pid" && die "node $1 (pid $pid) is still there after SIGKILL; its pid file is kept"
  rm -f "$PIDFILE"
  say "killed node $1 (pid $pid)"
}

cmd_restart() {
  node_arg "${1:-}"
  select_node "$1"
  [ -z "$(broker_pid)" ] || die "node $1 runs already"
  [ -f "$PROPS" ] || die "node $1 was never started"
  need_java
  local pid port want deadline
  deadline=$(( $(date +%s) + ${KAFKA_START_TIMEOUT:-90} ))
  port="$(configured_port)"
  for want in "$port" "$(configured_cport)"; do
    port_open "$HOST" "$want" && die "node $1's port $want (from $PROPS) is taken by another process"
  done
  pid="$(launch_node)"
  [ -n "$pid" ] || die "could not launch node $1"
  wait_ready "$pid" "$port" "$deadline" || die "node $1 failed to restart (log: $LOG)"
  say "node $1 back (pid $pid)"
}

cmd_status() {
  local pid port i up=0
  for i in $(seq "$N"); do
    select_node "$i"
    pid="$(broker_pid)"
    [ -n "$pid" ] || continue
    up=1
    port="$(configured_port)"
    if kafka_answers "$HOST" "$port"; then
      echo "kafka: node $i running (pid $pid) at $HOST:$port"
    else
      echo "kafka: node $i process $pid alive but not answering on $HOST:$port"
    fi
  done
  [ "$up" -eq 1 ] && return 0
  echo "kafka: stopped"
  return 3
}

cmd_reset() {
  local i
  cmd_stop || die "not deleting the data of a node that still runs"
  for i in $(seq "$N"); do select_node "$i"; rm -rf "$DATA" "$PROPS"; done
  say "deleted the data under ${STATE#"$ROOT"/} (jars kept)"
}

# One kafka.sh at a time changes a state directory: a start running beside a stop (or
# another start) would read pid files the other is rewriting.
take_lock() {
  mkdir -p "$STATE"
  exec 9>"$STATE/.lock"
  flock -w 120 9 || die "another kafka.sh holds $STATE/.lock"
}

case "${1:-}" in stop | reset | kill | restart) take_lock ;; esac
case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  reset) cmd_reset ;;
  kill) cmd_kill "${2:-}" ;;
  restart) cmd_restart "${2:-}" ;;
  pid) node_arg "${2:-}"; select_node "$2"; broker_pid ;;
  run) shift; [ $# -ge 1 ] || die "usage: $0 run CLASS [ARGS...]"; fetch_jars; run_tool "$@" ;;
  *) echo "usage: $0 {start|stop|status|reset|kill I|restart I|pid I|run CLASS [ARGS...]}" >&2; exit 2 ;;
esac
