"""The Kubernetes shell around `largebatch.controller`: pure builders of the job's objects
(`manifests`); the kopf operator that observes, decides and applies comes on top of them."""
