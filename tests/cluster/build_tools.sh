#!/usr/bin/env bash
# Builds the test cluster's pinned binaries from their Go modules (tools/*/go.mod) into a per-user
# cache keyed by the versions, so that CI and later sessions reuse them; does nothing when they are
# there. Prints the folder.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
VERSIONS="k8s-v1.36.3-r1_etcd-v3.6.8_kwok-v0.8.0_helm-v3.22.0_coredns-v1.14.7_cni-v1.10.0"
BIN=${LARGEBATCH_CLUSTER_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/largebatch/$VERSIONS/bin}
mkdir -p "$BIN"
export CGO_ENABLED=0 GOFLAGS=-mod=mod

K8S=v1.36.3
# Without these the binaries call themselves v0.0.0-master, and kubectl warns about version skew.
K8S_LDFLAGS="-X k8s.io/component-base/version.gitVersion=$K8S -X k8s.io/component-base/version.gitMajor=1"
K8S_LDFLAGS="$K8S_LDFLAGS -X k8s.io/component-base/version.gitMinor=36 -X k8s.io/client-go/pkg/version.gitVersion=$K8S"

build() {  # build MODULE_DIR PACKAGE NAME [go build flags...]
    if [ -x "$BIN/$3" ]; then return; fi
    echo "building $3 (a first build takes minutes)..." >&2
    local tmp
    tmp="$BIN/$(dirname "$3")/.$(basename "$3").tmp"
    (cd "$here/tools/$1" && go build -trimpath "${@:4}" -o "$tmp" "$2")
    mv "$tmp" "$BIN/$3"
}

build kubernetes k8s.io/kubernetes/cmd/kube-apiserver kube-apiserver -ldflags "$K8S_LDFLAGS"
build kubernetes k8s.io/kubernetes/cmd/kube-controller-manager kube-controller-manager -ldflags "$K8S_LDFLAGS"
build kubernetes k8s.io/kubernetes/cmd/kube-scheduler kube-scheduler -ldflags "$K8S_LDFLAGS"
build kubernetes k8s.io/kubernetes/cmd/kubectl kubectl -ldflags "$K8S_LDFLAGS"
# The real node (tests/cluster/node.py): a kubelet running pods through Debian's containerd and runc,
# kube-proxy for Service addresses, CoreDNS for their names, the CNI plugins and the sandbox's pause.
build kubernetes k8s.io/kubernetes/cmd/kubelet kubelet -ldflags "$K8S_LDFLAGS"
build kubernetes k8s.io/kubernetes/cmd/kube-proxy kube-proxy -ldflags "$K8S_LDFLAGS"
build coredns . coredns
build pause . pause -ldflags "-s -w"
mkdir -p "$BIN/cni"
for plugin in main/bridge main/loopback ipam/host-local meta/portmap; do
    build cni "github.com/containernetworking/plugins/plugins/$plugin" "cni/${plugin#*/}"
done
build etcd . etcd
build kwok sigs.k8s.io/kwok/cmd/kwok kwok
build helm helm.sh/helm/v3/cmd/helm helm

# KWOK has no built-in lifecycle: its "fast" stages (nodes become Ready and keep a heartbeat, pods run,
# complete and go away), taken from the pinned kwok module.
if [ ! -f "$BIN/kwok-stages.yaml" ]; then
    stages="$(cd "$here/tools/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage"
    for f in node/fast/node-initialize node/heartbeat/node-heartbeat pod/fast/pod-ready pod/fast/pod-complete \
             pod/fast/pod-delete; do
        printf -- '---\n'
        cat "$stages/$f.yaml"
    done > "$BIN/.kwok-stages.yaml.tmp"
    mv "$BIN/.kwok-stages.yaml.tmp" "$BIN/kwok-stages.yaml"
fi
echo "$BIN"
