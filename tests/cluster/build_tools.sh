#!/usr/bin/env bash
# Builds the test cluster's pinned binaries from their Go modules (tools/*/go.mod), and takes the
# Prometheus Operator's CRDs (ServiceMonitor, PodMonitor, PrometheusRule) from its published module, into
# a per-user cache keyed by the versions, so that CI and later sessions reuse them; does nothing when they
# are there. Prints the folder.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
K8S=v1.36.3
PROMETHEUS=v0.316.0  # Prometheus 3.16.0: the Go module numbers 3.x releases v0.3xx
OPERATOR=v0.89.0
KUEUE=v0.17.0  # its own folder below, so that the other binaries are not rebuilt when it changes
VERSIONS="k8s-$K8S-r2_etcd-v3.6.8_kwok-v0.8.0_helm-v3.22.0_coredns-v1.14.7_cni-v1.10.0_prometheus-${PROMETHEUS}_operator-$OPERATOR"
BIN=${LARGEBATCH_CLUSTER_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/largebatch/$VERSIONS/bin}
mkdir -p "$BIN"
export CGO_ENABLED=0 GOFLAGS=-mod=mod

# Without these the binaries call themselves v0.0.0-master, and kubectl warns about version skew.
K8S_LDFLAGS="-X k8s.io/component-base/version.gitVersion=$K8S -X k8s.io/component-base/version.gitMajor=1"
K8S_LDFLAGS="$K8S_LDFLAGS -X k8s.io/component-base/version.gitMinor=36 -X k8s.io/client-go/pkg/version.gitVersion=$K8S"

# build MODULE_DIR DEST TAGS LDFLAGS PACKAGE...: the commands missing from $BIN/DEST, in one `go build` (the
# links of some overlap the compiles of others). -s -w leave out the symbol table and DWARF, which halve a
# link's time; a panic's stack still names files and lines.
build() {
    local module=$1 dest="$BIN/$2" tags=$3 ldflags=$4 missing=() package
    shift 4
    for package in "$@"; do
        [ -x "$dest/$(basename "$package")" ] || missing+=("$package")
    done
    if [ ${#missing[@]} -eq 0 ]; then return; fi
    echo "building ${missing[*]##*/} (a first build takes minutes)..." >&2
    local start=$SECONDS tmp
    mkdir -p "$dest"
    tmp=$(mktemp -d "$dest/.build.XXXXXX")
    (cd "$here/tools/$module" && go build -trimpath -tags "$tags" -ldflags "-s -w $ldflags" -o "$tmp/" "${missing[@]}")
    mv "$tmp"/* "$dest/"
    rmdir "$tmp"
    echo "built ${missing[*]##*/} in $((SECONDS - start)) s" >&2
}

# The control plane, and for the real node (tests/cluster/node.py) a kubelet running pods through Debian's
# containerd and runc, kube-proxy for Service addresses, CoreDNS for their names, the CNI plugins and the
# sandbox's pause.
build kubernetes . "" "$K8S_LDFLAGS" \
    k8s.io/kubernetes/cmd/{kube-apiserver,kube-controller-manager,kube-scheduler,kubectl,kubelet,kube-proxy}
build etcd . "" "" largebatch.dev/testcluster/etcd
build pause . "" "" largebatch.dev/testcluster/pause
build cni cni "" "" \
    github.com/containernetworking/plugins/plugins/{main/bridge,main/loopback,ipam/host-local,meta/portmap}
# remove_all_sd leaves out every service-discovery plugin of Prometheus but static and file discovery (the
# tests scrape static targets).
build addons . remove_all_sd "-X github.com/prometheus/common/version.Version=3.16.0" \
    github.com/prometheus/prometheus/cmd/{prometheus,promtool} helm.sh/helm/v3/cmd/helm sigs.k8s.io/kwok/cmd/kwok \
    largebatch.dev/testcluster/addons/coredns

# KWOK has no built-in lifecycle: its "fast" stages (nodes become Ready and keep a heartbeat, pods run,
# complete and go away), taken from the pinned kwok module.
# Kueue's controller manager, CRDs and webhook registrations (tests/cluster/kueue.py), from a module of its
# own (tools/kueue) so that its dependencies are the versions Kueue was released with. With its own
# certificates (internalCertManagement off) Kueue's main.go reads the metrics server's keypair from the
# fixed folder /etc/kueue/metrics/certs, which a test has no business writing. So the command is built from
# a copy of that main.go (one file, package main, no internal imports) with that one path replaced by
# $KUEUE_METRICS_CERT_DIR, laid over tools/kueue/kueue/main.go by `go build -overlay` (Go refuses overlays
# of the module cache itself); the build stops if the line is not there any more.
KUEUE_DIR="$BIN/kueue-$KUEUE"
# The module's folder in the module cache, downloaded first: `go list -m` names no folder for a module
# not downloaded yet (a fresh machine), and nothing is built from it before the patch needs it.
kueue_module() { (cd "$here/tools/kueue" && go mod download sigs.k8s.io/kueue && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue); }
if [ ! -x "$KUEUE_DIR/kueue" ]; then
    module=$(kueue_module)
    patched=$(mktemp -d)
    original='metricsCertPath := "/etc/kueue/metrics/certs"'
    grep -qF "$original" "$module/cmd/kueue/main.go" || { echo "kueue $KUEUE: $original is gone" >&2; exit 1; }
    sed "s|$original|metricsCertPath := os.Getenv(\"KUEUE_METRICS_CERT_DIR\")|" "$module/cmd/kueue/main.go" > "$patched/main.go"
    printf '{"Replace": {"%s": "%s"}}' "$here/tools/kueue/kueue/main.go" "$patched/main.go" > "$patched/overlay.json"
    GOFLAGS="$GOFLAGS -overlay=$patched/overlay.json" build kueue "kueue-$KUEUE" "" "" largebatch.dev/testcluster/kueue/kueue
    rm -r "$patched"
fi
if [ ! -d "$KUEUE_DIR/manifests" ]; then
    module=$(kueue_module)
    mkdir -p "$KUEUE_DIR/.manifests.tmp"
    install -m 644 "$module"/config/components/crd/bases/*.yaml "$KUEUE_DIR/.manifests.tmp/"
    install -m 644 "$module/config/components/webhook/manifests.yaml" "$KUEUE_DIR/.manifests.tmp/webhooks.yaml"
    mv "$KUEUE_DIR/.manifests.tmp" "$KUEUE_DIR/manifests"
fi

if [ ! -f "$BIN/kwok-stages.yaml" ]; then
    stages="$(cd "$here/tools/addons" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage"
    for f in node/fast/node-initialize node/heartbeat/node-heartbeat pod/fast/pod-ready pod/fast/pod-complete \
             pod/fast/pod-delete; do
        printf -- '---\n'
        cat "$stages/$f.yaml"
    done > "$BIN/.kwok-stages.yaml.tmp"
    mv "$BIN/.kwok-stages.yaml.tmp" "$BIN/kwok-stages.yaml"
fi

if [ ! -d "$BIN/crds" ]; then
    module=$(cd "$here/tools/addons" && go mod download -json "github.com/prometheus-operator/prometheus-operator@$OPERATOR" |
        sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    mkdir -p "$BIN/.crds.tmp"
    for kind in servicemonitors podmonitors prometheusrules; do
        install -m 644 "$module/example/prometheus-operator-crd/monitoring.coreos.com_$kind.yaml" "$BIN/.crds.tmp/"
    done
    mv "$BIN/.crds.tmp" "$BIN/crds"
fi
echo "$BIN"
