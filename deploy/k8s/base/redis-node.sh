#!/bin/sh
# One node of the StatefulSet redis: the primary, or a replica of the primary.
#
# Which one: what the sentinels say is the primary of $MASTER_NAME now (after a failover it is
# not the first node any more); when no sentinel answers (the first start), the first of
# $REDIS_NODES. Every node announces itself by its stable name ($SELF, e.g. redis-1.redis), so
# the sentinels and Chorus reach it by name whatever its pod's address.
#
# The password ($REDIS_PASSWORD, from the Secret chorus-redis) goes into the config file with
# every byte escaped, so any password works. Arguments are passed on to redis-server.
set -eu
: "${SELF:?}" "${REDIS_NODES:?}" "${REDIS_PASSWORD:?}"
SENTINEL_HOST=${SENTINEL_HOST:-redis-sentinel}
SENTINEL_PORT=${SENTINEL_PORT:-26379}
MASTER_NAME=${MASTER_NAME:-mymaster}
REDIS_PORT=${REDIS_PORT:-6379}
RUN_DIR=${RUN_DIR:-/run/redis}
BASE_CONF=${BASE_CONF:-/etc/redis/redis.conf}

# a value as one double-quoted token of Redis's config syntax, every byte as \xHH
quote() {
  printf '"%s"' "$(printf '%s' "$1" | od -An -v -tx1 | tr -d ' \n' | sed 's/../\\x&/g')"
}

primary= primary_port=$REDIS_PORT
if answer=$(timeout 3 redis-cli -h "$SENTINEL_HOST" -p "$SENTINEL_PORT" --raw \
    sentinel get-master-addr-by-name "$MASTER_NAME" 2>/dev/null); then
  primary=$(printf '%s\n' "$answer" | sed -n 1p | tr -d '\r')
  primary_port=$(printf '%s\n' "$answer" | sed -n 2p | tr -d '\r')
fi
case "$primary_port" in '' | *[!0-9]*) primary= ;; esac
if [ -z "$primary" ]; then
  primary=${REDIS_NODES%% *} primary_port=$REDIS_PORT
  echo "redis-node: no sentinel knows $MASTER_NAME: $primary is the primary"
else
  echo "redis-node: the sentinels say $primary:$primary_port is the primary of $MASTER_NAME"
fi

conf=$RUN_DIR/redis.conf
{
  echo "include $BASE_CONF"
  echo "port $REDIS_PORT"
  echo "replica-announce-ip $SELF"
  echo "requirepass $(quote "$REDIS_PASSWORD")"
  echo "masterauth $(quote "$REDIS_PASSWORD")"
  if [ "$primary" != "$SELF" ]; then
    echo "replicaof $primary $primary_port"
  fi
} > "$conf"
exec redis-server "$conf" "$@"
