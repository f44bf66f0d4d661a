#!/usr/bin/env bash
# Stop the daemons scripts/slurm/start_local_slurm.sh started (by the PIDs it recorded), nothing else.
#   scripts/slurm/stop_local_slurm.sh [STATE_DIR]            # default /tmp/counterfactory-slurm
# Jobs still running on the local node are cancelled first. Set CF_LOCAL_SLURM_KEEP=1 to keep
# STATE_DIR (logs, configuration) afterwards.
set -uo pipefail

STATE=${1:-${CF_LOCAL_SLURM_DIR:-/tmp/counterfactory-slurm}}
export PATH="/usr/sbin:/sbin:$PATH"
log() { echo "[stop_local_slurm] $*" >&2; }

[ -d "$STATE/pids" ] || { log "nothing to stop: $STATE/pids does not exist"; exit 0; }

if [ -f "$STATE/slurm.conf" ] && command -v scancel >/dev/null; then
    SLURM_CONF="$STATE/slurm.conf" timeout 10 scancel --full --quiet --partition=cpu,gpu >/dev/null 2>&1 || true
fi

# slurmd and slurmctld before munged (they authenticate through it while shutting down)
for name in slurmd slurmctld munged; do
    pidfile="$STATE/pids/$name.pid"
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    # only a process of that name (the pid file could be stale and the number reused)
    if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ]; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$pid" 2>/dev/null; then
            log "$name ($pid) ignored SIGTERM; sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
        log "stopped $name ($pid)"
    fi
    rm -f "$pidfile"
done

if [ "${CF_LOCAL_SLURM_KEEP:-0}" != 1 ] && [ -f "$STATE/.counterfactory-local-slurm" ]; then
    rm -rf "$STATE"
fi
