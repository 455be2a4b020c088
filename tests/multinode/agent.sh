#!/bin/bash
# mpirun's rsh agent for the multi-"machine" tests: `agent.sh HOST COMMAND...` runs
# COMMAND "on" HOST, a network namespace made by tests/multinode/run.sh, in its own UTS,
# mount and IPC namespaces with a private tmpfs on /dev/shm (otherwise UCX finds the other
# "machine"'s shared memory and no byte crosses the veth). When COMMAND (Open MPI's
# daemon) ends, whatever is left in that /dev/shm is listed into $EPX_MN_LOG/shm-HOST.*.
host=$1
shift
case "$host" in epx-*) ;; *) echo "agent.sh: refusing host '$host' (not a test namespace)" >&2; exit 2 ;; esac
exec ip netns exec "$host" unshare --uts --mount --ipc --propagation private /bin/sh -c '
  host=$1; shift
  hostname "$host" && mount -t tmpfs -o size=2g,mode=1777 tmpfs /dev/shm || exit 97
  "$@"; rc=$?
  [ -n "$EPX_MN_LOG" ] && ls -A /dev/shm > "$EPX_MN_LOG/shm-$host.$$" 2>&1
  exit $rc' agent "$host" /bin/sh -c "$*"
