"""LargeBatchJobs read from a cluster found the way kubectl finds it ($KUBECONFIG or ~/.kube/config, the
current or a named context, in-cluster config inside a pod), with errors that say what is wrong:
no cluster configured or reachable, the CRD not installed, the job not there."""

from __future__ import annotations

from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from largebatch import api
from largebatch.kube import api_errors


class ClusterError(Exception):
    """Something between lbctl and the jobs is missing; the message says what and how to fix it."""


class Cluster:
    def __init__(self, context: str | None = None):
        try:
            config.load_kube_config(context=context)
            contexts, current = config.list_kube_config_contexts()
            chosen = next((c for c in contexts if c["name"] == context), current) if context else current
            self.namespace = chosen.get("context", {}).get("namespace", "default")
        except (config.ConfigException, FileNotFoundError) as exc:
            try:
                config.load_incluster_config()
                self.namespace = "default"
            except config.ConfigException:
                raise ClusterError(
                    f"no cluster configured ({exc}): set KUBECONFIG or create ~/.kube/config, as kubectl needs"
                ) from None
        self.api = client.ApiClient()
        self.host = self.api.configuration.host

    def _call(self, what: str, call, *args, **kwargs) -> Any:
        try:
            return call(*args, **kwargs)
        except HTTPError as exc:
            raise ClusterError(f"cannot reach the cluster at {self.host}: {exc}") from None
        except ApiException as exc:
            if exc.status == 404 and not self._served():
                raise ClusterError(
                    f"the LargeBatchJob CRD ({api.PLURAL}.{api.GROUP}) is not installed in the cluster at "
                    f"{self.host}: helm install the largebatch chart, or kubectl apply -f crds/"
                ) from None
            if exc.status == 404:
                raise ClusterError(f"{what} not found") from None
            if exc.status == 409:
                raise ClusterError(f"{what} already exists: delete it first, or choose another name") from None
            if exc.status == 422:
                raise ClusterError(f"the API server refused {what}: {api_errors.message(exc)}") from None
            if exc.status in (401, 403):
                raise ClusterError(f"not allowed to read {what}: {exc.reason}") from None
            raise ClusterError(f"reading {what} failed: {exc.status} {exc.reason}") from None

    def _served(self) -> bool:
        """Whether the API server serves LargeBatchJobs (a 404 means a missing job, or a missing CRD)."""
        try:
            groups = client.ApisApi(self.api).get_api_versions().groups
        except (ApiException, HTTPError):
            return True  # cannot tell: report the 404 as it came
        return any(g.name == api.GROUP and any(v.version == api.VERSION for v in g.versions) for g in groups)

    def jobs(self, namespace: str | None) -> list[dict[str, Any]]:
        """Jobs of one namespace, or of all (None), sorted by namespace and name."""
        custom = client.CustomObjectsApi(self.api)
        if namespace is None:
            found = self._call("largebatchjobs", custom.list_cluster_custom_object, api.GROUP, api.VERSION, api.PLURAL)
        else:
            found = self._call(
                f"largebatchjobs in namespace {namespace}",
                custom.list_namespaced_custom_object,
                api.GROUP,
                api.VERSION,
                namespace,
                api.PLURAL,
            )
        return sorted(found["items"], key=lambda j: (j["metadata"]["namespace"], j["metadata"]["name"]))

    def job(self, namespace: str, name: str) -> dict[str, Any]:
        custom = client.CustomObjectsApi(self.api)
        return self._call(
            f"largebatchjob {name} in namespace {namespace}",
            custom.get_namespaced_custom_object,
            api.GROUP,
            api.VERSION,
            namespace,
            api.PLURAL,
            name,
        )

    def submit(self, namespace: str, document: dict[str, Any]) -> dict[str, Any]:
        """Create a job from its manifest; the API server's refusal (CEL rules, a taken name) as a ClusterError."""
        custom = client.CustomObjectsApi(self.api)
        name = document.get("metadata", {}).get("name")
        document = document | {"metadata": document.get("metadata", {}) | {"namespace": namespace}}
        return self._call(
            f"largebatchjob {name} in namespace {namespace}",
            custom.create_namespaced_custom_object,
            api.GROUP,
            api.VERSION,
            namespace,
            api.PLURAL,
            document,
        )

    def events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """The job's Events, oldest first."""
        core = client.CoreV1Api(self.api)
        found = self._call(
            f"events of {name}",
            core.list_namespaced_event,
            namespace,
            field_selector=f"involvedObject.kind={api.KIND},involvedObject.name={name}",
        )
        events = [self.api.sanitize_for_serialization(e) for e in found.items]
        return sorted(events, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
