//go:build tools

// Kueue's controller manager for the e2e tests of the Kueue integration, in its own module so that its
// dependencies are the versions Kueue itself was released with, not the other tools' newer ones.
package tools

import _ "sigs.k8s.io/kueue/cmd/kueue"
