#!/usr/bin/env bash
# Power saving for the local test cluster: slurmctld's SuspendProgram and ResumeProgram.
#   power_local.sh suspend|resume CLUSTER_HOME PYTHON HOSTLIST
# On the local cluster a node's "power" is its slurmd: suspend stops it, resume starts it
# again. A resumed slurmd must look freshly booted (slurmctld otherwise marks the node DOWN
# after ResumeTimeout), so it starts in a new time namespace whose boot clock starts now, and
# with an empty blocked-signal mask (slurmctld runs this program with signals blocked, which
# the daemon would inherit). On a real cluster, point SuspendProgram/ResumeProgram at your
# IPMI/BMC or cloud scripts instead.
set -euo pipefail
action=$1 home=$2 python=$3 hostlist=$4
export SLURM_CONF="$home/etc/slurm.conf" PATH="/usr/sbin:/usr/bin:/sbin:/bin:${PATH:-}"
log="$home/log/power.log"
for node in $(scontrol show hostnames "$hostlist"); do
  echo "$(date -u +%FT%TZ) $action $node" >>"$log"
  pidfile="$home/run/slurmd-$node.pid"
  case "$action" in
    suspend)
      if [[ -s $pidfile ]]; then
        kill -TERM "$(cat "$pidfile")" 2>/dev/null || true
        for _ in $(seq 1 50); do kill -0 "$(cat "$pidfile")" 2>/dev/null || break; sleep 0.1; done
      fi
      ;;
    resume)
      # slurmctld takes the node as resumed only if its boot time is after the power-up
      # request: wait past the request's second, then boot clock offset -uptime (0 s now)
      sleep 1.5
      uptime=$(cut -d. -f1 /proc/uptime)
      "$python" -c 'import os, signal, sys
signal.pthread_sigmask(signal.SIG_SETMASK, set())
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(s, signal.SIG_DFL)
os.execvp(sys.argv[1], sys.argv[1:])' \
        unshare --time --fork --boottime "$((0 - uptime))" \
        slurmd -N "$node" >>"$home/log/power.log" 2>&1 &
      ;;
    *) echo "power_local.sh: unknown action $action" >&2; exit 2 ;;
  esac
done
wait
