#!/bin/sh
# The entrypoint of docker-compose.yml's sentinels (redis-sentinel-1..3): writes the config file
# the command names (`redis-server CONF --sentinel`) from the template $TEMPLATE
# (infra/redis-sentinel.conf), then runs the command through the image's own entrypoint, which
# drops to the redis user. deploy/k8s/base/redis-sentinel.sh does the same on Kubernetes.
#
# Which primary it watches, first of: the one another sentinel already watches (after a
# failover, no longer the first); else the node of $REDIS_NODES that says it is a primary; else
# the primary a node that says it is a replica follows (the nodes keep their roles across
# restarts: infra/redis-node.sh), once every node answers (or those that do in NODES_WAIT_S).
# Then it waits until the primary answers (Sentinel refuses a name that does not resolve, as a
# stopped container's).
#
# The config is made anew at every start, and the sentinel announces itself by its service name
# ($SELF): one that restarts replaces its old entry in the others' lists instead of adding a
# dead one (dead entries would count against the majority a failover needs).
set -eu
: "${SELF:?}" "${SENTINELS:?}" "${REDIS_NODES:?}"
TEMPLATE=${TEMPLATE:-/usr/local/etc/redis/sentinel.conf}

if [ "${1:-}" != redis-server ] || [ $# -lt 2 ]; then
  echo "redis-sentinel: the command must be redis-server CONF --sentinel, not: $*" >&2
  exit 2
fi
conf=$2
sentinel_port=$(sed -n 's/^port[[:space:]]\{1,\}\([0-9]\{1,\}\).*/\1/p' "$TEMPLATE")
sentinel_port=${sentinel_port:-26379}
# `sentinel monitor NAME HOST PORT QUORUM`: the name, the first primary, its port, the quorum
read -r name _ redis_port quorum <<MONITOR
$(sed -n 's/^sentinel[[:space:]]\{1,\}monitor[[:space:]]\{1,\}//p' "$TEMPLATE")
MONITOR
: "${name:?no sentinel monitor line in $TEMPLATE}" "${quorum:?}"

# another sentinel's answer: "HOST PORT", or nothing
from_sentinels() {
  for sentinel in $SENTINELS; do
    [ "$sentinel" = "$SELF" ] && continue
    answer=$(timeout 3 redis-cli -h "$sentinel" -p "$sentinel_port" --raw \
      sentinel get-master-addr-by-name "$name" 2>/dev/null) || continue
    host=$(printf '%s\n' "$answer" | sed -n 1p | tr -d '\r')
    port=$(printf '%s\n' "$answer" | sed -n 2p | tr -d '\r')
    case "$port" in '' | *[!0-9]*) continue ;; esac
    echo "redis-sentinel: $sentinel watches $host:$port" >&2
    echo "$host $port"
    return 0
  done
  return 0
}

# the nodes' own word, one line: how many answer, then the primary (the first that says it is
# one, else the one a replica follows) and every node that says it is one, comma-separated
from_nodes() {
  answered=0 masters= followed=
  for node in $REDIS_NODES; do
    # (a node that does not answer prints nothing: no role)
    info=$(timeout 3 redis-cli -h "$node" -p "$redis_port" info replication 2>/dev/null | tr -d '\r')
    case "$(printf '%s\n' "$info" | sed -n 's/^role://p')" in
      master)
        answered=$((answered + 1))
        masters="${masters:+$masters,}$node"
        ;;
      slave)
        answered=$((answered + 1))
        host=$(printf '%s\n' "$info" | sed -n 's/^master_host://p')
        port=$(printf '%s\n' "$info" | sed -n 's/^master_port://p')
        [ -n "$followed" ] || [ -z "$host" ] || followed="$host $port"
        ;;
    esac
  done
  if [ -n "$masters" ]; then
    echo "$answered ${masters%%,*} $redis_port $masters"
  else
    echo "$answered ${followed:-- -} -"
  fi
  return 0
}

# Until a sentinel answers, or the nodes do: all of them (so that sentinels starting together
# reach the same answer), or those that answer within NODES_WAIT_S.
NODES_WAIT_S=${NODES_WAIT_S:-30}
nodes=0
for node in $REDIS_NODES; do nodes=$((nodes + 1)); done
waited=0
primary=$(from_sentinels)
while [ -z "$primary" ]; do
  read -r answered host port masters <<NODES
$(from_nodes)
NODES
  if [ "$host" != - ] && { [ "$answered" -eq "$nodes" ] || [ "$waited" -ge "$NODES_WAIT_S" ]; }; then
    primary="$host $port"
    case "$masters" in *,*)
      echo "redis-sentinel: $masters all say they are the primary: watching $host. The others'" \
        "writes since are not replicated: keep the node with the later ones, make the other its" \
        "replica (redis-cli replicaof), then restart the sentinels (docs/operations.md)" >&2 ;;
    esac
    break
  fi
  echo "redis-sentinel: $answered of $nodes Redis nodes answer ($REDIS_NODES); waiting" >&2
  sleep 2
  waited=$((waited + 2))
  primary=$(from_sentinels)  # another sentinel may have chosen meanwhile
done
host=${primary% *} port=${primary#* }
until timeout 3 redis-cli -h "$host" -p "$port" ping > /dev/null 2>&1; do
  echo "redis-sentinel: waiting for the primary $host:$port" >&2
  sleep 2
done
echo "redis-sentinel: watching $host:$port as $name (quorum $quorum)"

monitor="sentinel monitor $name $host $port $quorum"
{
  awk -v monitor="$monitor" '/^sentinel[ \t]+monitor[ \t]/ { print monitor; next } { print }' "$TEMPLATE"
  echo "dir $(dirname "$conf")"
  echo "sentinel announce-ip $SELF"
  echo "sentinel announce-port $sentinel_port"
} > "$conf"
exec docker-entrypoint.sh "$@"
