#!/usr/bin/env bash
# A throw-away single-node Slurm cluster on this machine, for tests/test_slurm.py and for trying
# `snakemake --profile slurm` without a real cluster.
#
#   sudo scripts/slurm/start_local_slurm.sh [STATE_DIR]     # default /tmp/counterfactory-slurm
#   source STATE_DIR/env.sh                                  # SLURM_CONF for sbatch/squeue/sinfo
#   scripts/slurm/stop_local_slurm.sh [STATE_DIR]
#
# What it does (needs root; Debian/Ubuntu):
#   1. installs Debian's slurmctld slurmd slurm-client munge with apt-get (apt-get update first),
#      unless the binaries are already there; waits up to CF_LOCAL_SLURM_APT_LOCK_WAIT seconds (600)
#      for an apt/dpkg lock another process holds;
#   2. writes a private munge key and a single-node slurm.conf / gres.conf under STATE_DIR: node
#      "cfnode" with this machine's CPUs and ~80 % of its memory, two partitions (cpu = default,
#      gpu) and two FAKE GPUs declared through GRES (gres.conf File= points at character devices
#      STATE_DIR/dev/nvidia0..1 made with mknod as copies of /dev/null), so Slurm allocates GPUs and
#      sets CUDA_VISIBLE_DEVICES without any GPU present;
#      no accounting database (the Snakemake plugin must use `squeue` as status command, hence
#      MinJobAge=600 >= 3 x its initial status-check delay);
#      STATE_DIR/env.sh sets SLURM_CONF and puts an srun wrapper first in PATH (the Slurm jobstep
#      plugin drops SLURM_* variables before calling srun inside a job);
#   3. starts munged, slurmctld and slurmd WITHOUT systemd, on private ports and a private munge
#      socket, so a system Slurm/munge (if any) is left alone; their PIDs go to STATE_DIR/pids/.
# The stop script ends exactly those PIDs. Nothing outside STATE_DIR is written except the apt install.
set -euo pipefail

STATE=${1:-${CF_LOCAL_SLURM_DIR:-/tmp/counterfactory-slurm}}
CTLD_PORT=${CF_LOCAL_SLURM_CTLD_PORT:-16817}
SLURMD_PORT=${CF_LOCAL_SLURM_SLURMD_PORT:-16818}
NODE=cfnode
N_GPUS=2

log() { echo "[start_local_slurm] $*" >&2; }
die() { log "error: $*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "needs root (installs packages, runs slurmd). Run with sudo, or as root in CI."

# ---------------------------------------------------------------- 1. packages
need_install=0
for bin in munged slurmctld slurmd sbatch squeue sinfo scontrol; do
    command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] || need_install=1
done
if [ "$need_install" = 1 ]; then
    command -v apt-get >/dev/null || die "Slurm is not installed and apt-get is not available"
    log "installing slurmctld slurmd slurm-client munge (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt_log=$(mktemp)
    # another apt/dpkg run (an unattended upgrade, a second install) may hold the package locks: wait for
    # them up to CF_LOCAL_SLURM_APT_LOCK_WAIT seconds (apt's DPkg::Lock::Timeout covers the dpkg lock; the
    # loop covers the lists lock of `apt-get update`, which apt does not wait for)
    lock_wait=${CF_LOCAL_SLURM_APT_LOCK_WAIT:-600}
    deadline=$(( $(date +%s) + lock_wait ))
    apt_locked() {
        local rc=0
        apt-get -o DPkg::Lock::Timeout="$lock_wait" "$@" >>"$apt_log" 2>&1 || rc=$?
        while [ "$rc" -ne 0 ] && grep -q "Could not get lock\|Unable to acquire the dpkg frontend lock" "$apt_log" \
                && [ "$(date +%s)" -lt "$deadline" ]; do
            log "waiting for the apt/dpkg lock another process holds (up to ${lock_wait} s in all)"
            sleep 5
            : >"$apt_log"
            rc=0
            apt-get -o DPkg::Lock::Timeout="$lock_wait" "$@" >>"$apt_log" 2>&1 || rc=$?
        done
        return "$rc"
    }
    # the packages try to start their services through systemd; without it that step just fails softly
    if ! { apt_locked update -qq && apt_locked install -y -qq --no-install-recommends \
            slurmctld slurmd slurm-client munge; }; then
        tail -n 30 "$apt_log" >&2
        if grep -q "Could not get lock\|Unable to acquire the dpkg frontend lock" "$apt_log"; then
            die "apt-get could not install Slurm: another process still held the apt/dpkg lock after waiting" \
                "${lock_wait} s (CF_LOCAL_SLURM_APT_LOCK_WAIT); rerun once it is done"
        fi
        die "apt-get could not install Slurm (output above)"
    fi
    rm -f "$apt_log"
fi
export PATH="/usr/sbin:/sbin:$PATH"

# ---------------------------------------------------------------- 2. configuration
if [ -f "$STATE/pids/slurmctld.pid" ] && kill -0 "$(cat "$STATE/pids/slurmctld.pid")" 2>/dev/null; then
    die "a local Slurm from $STATE is already running; stop it first: scripts/slurm/stop_local_slurm.sh $STATE"
fi
# wipe an earlier state folder of ours, never a foreign non-empty folder
if [ -d "$STATE" ] && [ -n "$(ls -A "$STATE")" ]; then
    [ -f "$STATE/.counterfactory-local-slurm" ] || die "$STATE exists and is not a local-Slurm state folder"
    rm -rf "$STATE"
fi
mkdir -p "$STATE"/{munge,pids,log,spool/ctld,spool/d,dev}
touch "$STATE/.counterfactory-local-slurm"
chmod 700 "$STATE/munge"

# at least 2 CPUs (model jobs ask for 2 threads); config_overrides lets slurmd accept more than it has
cpus=$(nproc)
[ "$cpus" -ge 2 ] || cpus=2
mem_total_mb=$(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo)
real_mem=$(( mem_total_mb * 8 / 10 ))
host=$(hostname -s)

# fake GPU device files for GRES: Slurm wants character devices. STATE_DIR/dev/nvidiaN are made
# with mknod as copies of /dev/null (major 1, minor 3): harmless if anything ever opens them. Where
# mknod is not allowed (some containers), /dev/null and /dev/zero themselves stand in.
gres_files=()
for i in $(seq 0 $((N_GPUS - 1))); do
    if mknod "$STATE/dev/nvidia$i" c 1 3 2>/dev/null; then
        gres_files+=("$STATE/dev/nvidia$i")
    else
        gres_files=(/dev/null /dev/zero)
        break
    fi
done

# private munge key (1 KiB random), owned by root: munged runs as root here
dd if=/dev/urandom of="$STATE/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$STATE/munge/munge.key"

cat > "$STATE/slurm.conf" <<EOF
# single-node test cluster written by scripts/slurm/start_local_slurm.sh
ClusterName=counterfactory-local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$STATE/munge/munge.socket.2
StateSaveLocation=$STATE/spool/ctld
SlurmdSpoolDir=$STATE/spool/d
SlurmctldPidFile=$STATE/pids/slurmctld.pid
SlurmdPidFile=$STATE/pids/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
ReturnToService=2
SlurmdParameters=config_overrides
# squeue must still see finished jobs when the Snakemake plugin polls (>= 3 x initial delay)
MinJobAge=600
KillWait=5
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$NODE NodeHostname=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$real_mem Gres=gpu:$N_GPUS State=UNKNOWN
PartitionName=cpu Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=$NODE Default=NO MaxTime=INFINITE State=UP
EOF

for f in "${gres_files[@]}"; do echo "NodeName=$NODE Name=gpu File=$f"; done > "$STATE/gres.conf"

# Client commands find this cluster through SLURM_CONF. The Slurm jobstep plugin drops every SLURM_*
# variable before it calls srun inside a job, so srun would look for /etc/slurm/slurm.conf (which we
# leave alone): a small srun wrapper first in PATH puts SLURM_CONF back.
mkdir -p "$STATE/bin"
real_srun=$(command -v srun)
cat > "$STATE/bin/srun" <<EOF
#!/bin/sh
# written by scripts/slurm/start_local_slurm.sh: srun against the local test cluster
SLURM_CONF=$STATE/slurm.conf exec $real_srun "\$@"
EOF
chmod +x "$STATE/bin/srun"
cat > "$STATE/env.sh" <<EOF
# source me: clients (sbatch, squeue, sinfo, scontrol, srun) talk to the local test cluster
export SLURM_CONF=$STATE/slurm.conf
export PATH=$STATE/bin:\$PATH
# site settings of the profiles (README "Running on a cluster") for this cluster
export CF_SLURM_PARTITION=cpu CF_SLURM_GPU_PARTITION=gpu CF_SLURM_STATUS_DELAY=5 CF_SLURM_MAX_THREADS=$cpus
EOF
export SLURM_CONF="$STATE/slurm.conf"

# ---------------------------------------------------------------- 3. daemons
log "starting munged"
munged --force --socket="$STATE/munge/munge.socket.2" --key-file="$STATE/munge/munge.key" \
    --pid-file="$STATE/pids/munged.pid" --log-file="$STATE/log/munged.log" \
    --seed-file="$STATE/munge/munged.seed"
for _ in $(seq 50); do [ -S "$STATE/munge/munge.socket.2" ] && break; sleep 0.1; done
[ -S "$STATE/munge/munge.socket.2" ] || die "munged did not start; see $STATE/log/munged.log"

log "starting slurmctld"
slurmctld -f "$SLURM_CONF" || die "slurmctld did not start; see $STATE/log/slurmctld.log"
log "starting slurmd"
slurmd -f "$SLURM_CONF" -N "$NODE" || die "slurmd did not start; see $STATE/log/slurmd.log"

# wait until the node is idle and accepts jobs
deadline=$(( $(date +%s) + 60 ))
until sinfo -h -n "$NODE" -o '%t' 2>/dev/null | grep -qE '^(idle|mix|alloc)'; do
    if [ "$(date +%s)" -gt "$deadline" ]; then
        log "node state: $(sinfo -h -n "$NODE" -o '%t %E' 2>&1 || true)"
        tail -n 20 "$STATE/log/slurmctld.log" "$STATE/log/slurmd.log" >&2 || true
        die "node $NODE did not become idle within 60 s"
    fi
    scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true
    sleep 1
done
log "local Slurm is up: $(sinfo -h -o '%P %D %c %m %G %t' | tr '\n' ';')"
echo "source $STATE/env.sh"
