#!/bin/sh
# One sentinel of the StatefulSet redis-sentinel, watching the primary of $MASTER_NAME.
#
# Which primary: the one another sentinel already watches; else the node of $REDIS_NODES that
# says it is a primary; else the first of them. The sentinel rewrites its config file as it
# learns (replicas, other sentinels, failovers), so it lives in $RUN_DIR (an emptyDir), made
# anew at every start. It announces itself by its stable name ($SELF), so a sentinel that
# restarts replaces its old entry in the others' lists instead of adding a dead one (dead
# entries would count against the majority a failover needs).
#
# Clients (Chorus: redis+sentinel://redis-sentinel:26379/mymaster) need no password for the
# sentinels; the network policy admits only Chorus and the Redis pods. (For one, add
# `requirepass` below and give Chorus CHORUS_REDIS_SENTINEL_PASSWORD, and the probes
# REDISCLI_AUTH.) Arguments are passed on to redis-server.
set -eu
: "${SELF:?}" "${REDIS_NODES:?}" "${REDIS_PASSWORD:?}"
SENTINEL_HOST=${SENTINEL_HOST:-redis-sentinel}
SENTINEL_PORT=${SENTINEL_PORT:-26379}
MASTER_NAME=${MASTER_NAME:-mymaster}
REDIS_PORT=${REDIS_PORT:-6379}
QUORUM=${QUORUM:-2}
RUN_DIR=${RUN_DIR:-/run/redis}

quote() {
  printf '"%s"' "$(printf '%s' "$1" | od -An -v -tx1 | tr -d ' \n' | sed 's/../\\x&/g')"
}

primary= primary_port=$REDIS_PORT
if answer=$(timeout 3 redis-cli -h "$SENTINEL_HOST" -p "$SENTINEL_PORT" --raw \
    sentinel get-master-addr-by-name "$MASTER_NAME" 2>/dev/null); then
  primary=$(printf '%s\n' "$answer" | sed -n 1p | tr -d '\r')
  primary_port=$(printf '%s\n' "$answer" | sed -n 2p | tr -d '\r')
fi
case "$primary_port" in '' | *[!0-9]*) primary= primary_port=$REDIS_PORT ;; esac
if [ -z "$primary" ]; then
  for node in $REDIS_NODES; do
    role=$(REDISCLI_AUTH=$REDIS_PASSWORD timeout 3 redis-cli -h "$node" -p "$REDIS_PORT" \
      info replication 2>/dev/null | tr -d '\r' | sed -n 's/^role://p') || role=
    if [ "$role" = master ]; then
      primary=$node
      break
    fi
  done
fi
primary=${primary:-${REDIS_NODES%% *}}
# a sentinel refuses to start on a name it cannot resolve: wait for the primary's pod
until REDISCLI_AUTH=$REDIS_PASSWORD timeout 3 redis-cli -h "$primary" -p "$primary_port" ping \
    > /dev/null 2>&1; do
  echo "redis-sentinel: waiting for $primary:$primary_port"
  sleep 2
done
echo "redis-sentinel: watching $primary:$primary_port as $MASTER_NAME"

conf=$RUN_DIR/sentinel.conf
cat > "$conf" <<CONF
port $SENTINEL_PORT
dir $RUN_DIR
sentinel resolve-hostnames yes
sentinel announce-hostnames yes
sentinel announce-ip $SELF
sentinel announce-port $SENTINEL_PORT
sentinel monitor $MASTER_NAME $primary $primary_port $QUORUM
sentinel auth-pass $MASTER_NAME $(quote "$REDIS_PASSWORD")
sentinel down-after-milliseconds $MASTER_NAME 5000
sentinel failover-timeout $MASTER_NAME 60000
sentinel parallel-syncs $MASTER_NAME 1
CONF
exec redis-server "$conf" "$@" --sentinel
