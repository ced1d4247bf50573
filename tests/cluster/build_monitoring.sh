#!/usr/bin/env bash
# Builds the observability tests' Prometheus and promtool from the upstream Go module
# (tools/prometheus/go.mod) and takes the Prometheus Operator's CRDs (ServiceMonitor, PodMonitor,
# PrometheusRule) from its published module, into a per-user cache keyed by the versions; does nothing
# when they are there. Prints the folder.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
PROMETHEUS=v0.316.0  # Prometheus 3.16.0: the Go module numbers 3.x releases v0.3xx
OPERATOR=v0.89.0
# remove_all_sd leaves out every service-discovery plugin but static and file discovery (the tests
# scrape static targets): most of a cold build's time otherwise.
TAGS=remove_all_sd
DIR=${LARGEBATCH_MONITORING_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/largebatch/prometheus-$PROMETHEUS-$TAGS-operator-$OPERATOR}
mkdir -p "$DIR"
export CGO_ENABLED=0 GOFLAGS=-mod=mod

for name in promtool prometheus; do
    if [ -x "$DIR/$name" ]; then continue; fi
    echo "building $name (a first build takes minutes)..." >&2
    (cd "$here/tools/prometheus" && go build -trimpath -tags "$TAGS" \
        -ldflags "-X github.com/prometheus/common/version.Version=3.16.0" \
        -o "$DIR/.$name.tmp" "github.com/prometheus/prometheus/cmd/$name")
    mv "$DIR/.$name.tmp" "$DIR/$name"
done

if [ ! -d "$DIR/crds" ]; then
    module=$(cd "$here/tools/prometheus" && go mod download -json "github.com/prometheus-operator/prometheus-operator@$OPERATOR" |
        sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    mkdir -p "$DIR/.crds.tmp"
    for kind in servicemonitors podmonitors prometheusrules; do
        install -m 644 "$module/example/prometheus-operator-crd/monitoring.coreos.com_$kind.yaml" "$DIR/.crds.tmp/"
    done
    mv "$DIR/.crds.tmp" "$DIR/crds"
fi
echo "$DIR"
