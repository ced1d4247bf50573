// Command pause is the pod sandbox's process on the test cluster's real node (the image kubelet's
// containerd names as sandbox_image): it holds the pod's namespaces and waits for a signal to end.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	<-stop
}
