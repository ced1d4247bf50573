"""The local shell: `lbctl run job.yaml --local` runs a job's workers as torchrun processes on this
machine, with the same controller decisions as the Kubernetes operator."""
