#!/bin/bash
# chorus-healthcheck: the container healthcheck of the Chorus services (infra/Dockerfile installs
# it as /usr/local/bin/chorus-healthcheck; docker-compose.yml calls it).
#
#   chorus-healthcheck                          the liveness file is fresh
#   chorus-healthcheck --http PORT/PATH         ... and GET http://127.0.0.1:PORT/PATH answers
#                                               (any status from 200 to 499: the server works)
#   chorus-healthcheck --no-liveness --http PORT/PATH    only the HTTP check (the simulated engine)
#
# Every Chorus service touches $CHORUS_LIVENESS_FILE on each heartbeat (every
# CHORUS_HEARTBEAT_INTERVAL_S, 0.25 s by default) while its event loop runs and its NATS
# connection is up, and removes it when it stops. "Fresh" means touched less than
# CHORUS_LIVENESS_MAX_AGE_S seconds ago (whole seconds, default 5). Each run costs a stat (and
# for --http one local HTTP request made by bash itself): no Python start-up, no NATS connection.
set -u

liveness=1
http=
while [ $# -gt 0 ]; do
  case "$1" in
    --no-liveness) liveness=0 ;;
    --http)
      [ $# -ge 2 ] || { echo "chorus-healthcheck: --http wants PORT/PATH" >&2; exit 2; }
      http=$2
      shift ;;
    *) echo "usage: chorus-healthcheck [--no-liveness] [--http PORT/PATH]" >&2; exit 2 ;;
  esac
  shift
done

if [ "$liveness" = 1 ]; then
  file=${CHORUS_LIVENESS_FILE:-}
  max_age=${CHORUS_LIVENESS_MAX_AGE_S:-5}
  if [ -z "$file" ]; then
    echo "CHORUS_LIVENESS_FILE is not set: the service writes no liveness file"
    exit 1
  fi
  if ! mtime=$(stat -c %Y -- "$file" 2>/dev/null); then
    echo "no liveness file $file yet: not connected to NATS, or not started"
    exit 1
  fi
  age=$(( ${EPOCHSECONDS:-$(date +%s)} - mtime ))
  if [ "$age" -ge "$max_age" ]; then
    echo "liveness file $file is ${age}s old (limit ${max_age}s): heartbeats stopped"
    exit 1
  fi
fi

if [ -n "$http" ]; then
  port=${http%%/*}
  path=/${http#*/}
  [ "$http" = "$port" ] && path=/
  if ! { exec 3<>"/dev/tcp/127.0.0.1/$port"; } 2>/dev/null; then
    echo "nothing answers on 127.0.0.1:$port"
    exit 1
  fi
  printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1:%s\r\nConnection: close\r\n\r\n' "$path" "$port" >&3
  if ! IFS= read -r -t "${CHORUS_HEALTHCHECK_TIMEOUT_S:-3}" status <&3; then
    echo "no answer to GET $path on :$port"
    exit 1
  fi
  exec 3<&-
  read -r _ code _ <<< "$status"
  case "$code" in
    [234][0-9][0-9]) ;;  # the server answers (a 401 or 404 still proves that)
    *) echo "GET $path on :$port answered ${status%$'\r'}"; exit 1 ;;
  esac
fi
exit 0
