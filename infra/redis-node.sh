#!/bin/sh
# The entrypoint of docker-compose.yml's Redis nodes (redis, redis-replica): picks the node's role,
# then runs the service's command (`redis-server FLAGS`) through the image's own entrypoint,
# which drops to the redis user. deploy/k8s/base/redis-node.sh does the same on Kubernetes.
#
# The role, first of:
#   1. what the sentinels ($SENTINELS, asked in turn) say is the primary of $MASTER_NAME now:
#      after a failover that is no longer the first primary, and a node coming back rejoins as
#      a replica of the new one;
#   2. when no sentinel answers (the first start, the whole stack starting at once): the role
#      the node last had, kept in $CONF on its data volume;
#   3. the first time: the command's (`--replicaof HOST PORT` in it: a replica; else primary).
#
# $CONF is redis-server's config file, written anew at each start with the role and the name
# the node announces ($SELF: the sentinels and the other node reach it by its service name,
# which outlives its container's address). When Sentinel changes a node's role (it promotes
# the replica, or points a node at a new primary) it saves the change there (CONFIG REWRITE),
# so a promoted replica that restarts with no sentinel around stays the primary instead of
# turning back into a replica of the old primary's older data. The command's other flags
# (persistence, memory) are passed on as they are, after $CONF, so they win over it.
set -eu
: "${SELF:?}" "${SENTINELS:?}" "${MASTER_NAME:?}"
CONF=${CONF:-/data/redis.conf}
REDIS_PORT=${REDIS_PORT:-6379}
SENTINEL_PORT=${SENTINEL_PORT:-26379}

if [ "${1:-}" != redis-server ]; then
  echo "redis-node: the command must be redis-server [FLAGS], not: $*" >&2
  exit 2
fi
shift
# the command's role, taken out of its flags (the role goes into $CONF)
first_role= n=$# i=0
while [ "$i" -lt "$n" ]; do
  arg=$1
  shift
  i=$((i + 1))
  if [ "$arg" = --replicaof ] || [ "$arg" = --slaveof ]; then
    first_role="$1 $2"
    shift 2
    i=$((i + 2))
    continue
  fi
  set -- "$@" "$arg"
done

primary=
for sentinel in $SENTINELS; do
  answer=$(timeout 3 redis-cli -h "$sentinel" -p "$SENTINEL_PORT" --raw \
    sentinel get-master-addr-by-name "$MASTER_NAME" 2>/dev/null) || continue
  host=$(printf '%s\n' "$answer" | sed -n 1p | tr -d '\r')
  port=$(printf '%s\n' "$answer" | sed -n 2p | tr -d '\r')
  case "$port" in '' | *[!0-9]*) continue ;; esac
  primary="$host $port"
  echo "redis-node: $sentinel says $host:$port is the primary of $MASTER_NAME"
  break
done
if [ -z "$primary" ] && [ -f "$CONF" ]; then
  primary=$(sed -n 's/^replicaof[[:space:]]\{1,\}//p' "$CONF" | tr -d '"' | sed -n 1p)
  primary=${primary:-"$SELF $REDIS_PORT"}
  echo "redis-node: no sentinel answers: the role $SELF last had (primary: ${primary% *})"
elif [ -z "$primary" ]; then
  primary=${first_role:-"$SELF $REDIS_PORT"}
  echo "redis-node: no sentinel answers, first start: the command's role (primary: ${primary% *})"
fi

{
  echo "# written by redis-node.sh at each start; Sentinel saves role changes here"
  echo "replica-announce-ip $SELF"
  if [ "${primary% *}" != "$SELF" ]; then
    echo "replicaof $primary"
  fi
} > "$CONF"
exec docker-entrypoint.sh redis-server "$CONF" "$@"
