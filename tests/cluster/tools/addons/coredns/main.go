// Command coredns is the cluster DNS of the test cluster's real node: upstream CoreDNS with only the
// plugins its Corefile uses (the default build compiles every cloud backend). Pods resolve Services
// (`<job>-rdzv`) and headless workers' names through it, as on any cluster.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
)

// The order in which the plugins handle a query: upstream's plugin.cfg order, less the ones left out.
func init() {
	dnsserver.Directives = []string{"bind", "errors", "log", "cache", "kubernetes"}
}

func main() {
	coremain.Run()
}
