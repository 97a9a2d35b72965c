#!/usr/bin/env bash
# Install the Debian packages a one-node test cluster needs (slurmctld, slurmd, munge, client tools).
# Idempotent: does nothing when the daemons are already on PATH. Needs root (CI runs as root).
set -euo pipefail

have_all() {
    for bin in slurmctld slurmd sbatch munged; do
        command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] || return 1
    done
}

if have_all; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "slurm/ci/install.sh: slurm-wlm and munge are missing and this is not root; install them with" >&2
    echo "  sudo apt-get install slurm-wlm munge" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# slurm-wlm pulls slurmctld + slurmd + slurm-client; --no-install-recommends keeps the image small.
apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
have_all || { echo "slurm/ci/install.sh: install finished but Slurm binaries are still missing" >&2; exit 1; }
echo "slurm/ci/install.sh: installed $(slurmctld -V 2>/dev/null || echo slurm) and munge"
