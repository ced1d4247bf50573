//go:build tools

// The tools around the control plane that are Kubernetes clients, in one module so that the Kubernetes
// client libraries they share (k8s.io/client-go and its API types, gRPC, protobuf) are compiled once for
// all of them rather than once per module version: that was most of a cold build's time.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
	_ "helm.sh/helm/v3/cmd/helm"
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
