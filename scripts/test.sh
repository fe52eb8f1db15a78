#!/usr/bin/env bash
# Installs what the tests need and runs them all. CI runs exactly this (see .ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v bwrap >/dev/null || need_apt+=(bubblewrap)
command -v git >/dev/null || need_apt+=(git)
command -v curl >/dev/null || need_apt+=(curl)     # agents' tool calls inside sandboxes
[ -x /usr/bin/python3 ] || need_apt+=(python3)     # agent runs: the in-sandbox entry and command gate
python3 -c 'import ensurepip' 2>/dev/null || need_apt+=(python3-venv)
command -v setpriv >/dev/null || need_apt+=(util-linux)
command -v perl >/dev/null || need_apt+=(perl-base)  # the sandboxes' init where no C compiler is
command -v gcc >/dev/null || need_apt+=(gcc)       # the sandboxes' C init; the LD_PRELOAD attack test's .so
PATH="$PATH:/usr/sbin:/sbin" command -v mkfs.btrfs >/dev/null || need_apt+=(btrfs-progs)  # disk quotas
[ -x /usr/bin/chromium ] || need_apt+=(chromium)   # the web page tests (headless)
command -v node >/dev/null || need_apt+=(nodejs)
# The PostgreSQL store's tests: a server on 127.0.0.1:5432 (or CORRAL_TEST_POSTGRES), and
# pg_createcluster for the test that restarts a private cluster.
installed_pg=0
if [ -z "${CORRAL_TEST_POSTGRES:-}" ] && ! command -v pg_createcluster >/dev/null; then
  need_apt+=(postgresql); installed_pg=1
fi
command -v npm >/dev/null || need_apt+=(npm)
PATH="$PATH:/usr/sbin:/sbin" command -v dockerd >/dev/null || need_apt+=(docker.io)  # the docker provider's tests
command -v mmdebstrap >/dev/null || need_apt+=(mmdebstrap)  # corral's base image
if ((${#need_apt[@]})); then
  echo "installing Debian packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

# The PostgreSQL store's tests need a server (CORRAL_TEST_POSTGRES, default 127.0.0.1:5432,
# user postgres, trust auth): start the machine's cluster when none answers.
if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  if [ -z "${CORRAL_TEST_POSTGRES:-}" ] && command -v pg_ctlcluster >/dev/null; then
    echo "starting PostgreSQL"
    for cluster in /etc/postgresql/*/*; do
      [ -d "$cluster" ] && pg_ctlcluster "$(basename "$(dirname "$cluster")")" "$(basename "$cluster")" start || true
    done
  fi
  for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null && break; sleep 1; done
fi
if [ "$installed_pg" = 1 ]; then
  # Debian's fresh cluster asks TCP clients for a password; the tests connect as postgres
  # without one, from this machine only.
  for hba in /etc/postgresql/*/main/pg_hba.conf; do
    [ -f "$hba" ] && sed -i '1i host all postgres 127.0.0.1/32 trust\nhost all postgres ::1/128 trust' "$hba" || true
  done
  for cluster in /etc/postgresql/*/main; do
    [ -d "$cluster" ] && pg_ctlcluster "$(basename "$(dirname "$cluster")")" main reload || true
  done
fi

# The docker provider's tests need a daemon: start one when none answers.
if ! docker info >/dev/null 2>&1; then
  echo "starting dockerd"
  (PATH="$PATH:/usr/sbin:/sbin" setsid dockerd >/var/log/corral-dockerd.log 2>&1 &)
  for _ in $(seq 1 120); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
fi

VENV=${CORRAL_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install -q --disable-pip-version-check -e '.[test]'

# corral's base image for the docker provider, built once (skipped when the tag exists)
if docker info >/dev/null 2>&1; then
  "$VENV/bin/python" -m corral images build >/dev/null
fi

# The page tests' screenshots (headless Chromium) land here; CI keeps the directory.
export CORRAL_ARTIFACTS="${CORRAL_ARTIFACTS:-$PWD/artifacts}"
# Two workers (one per core), whole files per worker: the suite is mostly waiting on agent
# CLIs, sandboxes and servers, and a file's tests share its fixtures. CORRAL_TEST_WORKERS=0
# runs it in this process. The agent CLIs on docker go first, alone: with the other
# worker's load their CLIs (gemini's above all) can take minutes to start. Every other
# docker test goes with them (~70 s): twice in CI, under the other worker's load, a docker
# test lost its way (a takeover's container gone; a run past its 2 s timeout not ending in
# 90 s), neither reproduced alone or under CPU load; the takeover test now says what the
# new host recorded if it happens again.
serial=(tests/agents/test_docker_agents.py tests/runs/test_docker_multihost.py
        tests/providers/test_docker_conformance.py tests/providers/test_docker_fs_answers.py
        tests/providers/test_docker_lifecycle.py tests/providers/test_docker_unreachable.py
        tests/security/test_docker_container.py tests/security/test_sandbox_boundary.py
        tests/security/test_sandbox_stores.py
        tests/runs/test_sandbox_gone.py tests/server/test_chaos_docker.py
        tests/security/test_local_users_docker.py tests/runs/test_docker_cancel.py
        tests/providers/test_docker_checkpoints.py tests/agents/test_threads_docker.py
        tests/security/test_docker_agent_channel.py tests/security/test_docker_fs_server.py)
# Every phase runs (mypy, ruff, the serial files, the rest), whatever an earlier one did;
# the status is non-zero if any failed, and the last line is pytest's summary with the
# counts of both pytest phases (scripts/test_phases.sh).
exec bash scripts/test_phases.sh "$VENV/bin/python" "${serial[@]}" -- "$@"
