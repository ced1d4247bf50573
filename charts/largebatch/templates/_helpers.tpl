{{- define "largebatch.fullname" -}}
{{- printf "%s-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* A name derived from the fullname (call with (list $ "suffix")), kept within the 63 characters
of a DNS label: a Service name over that limit is refused by the API server. */}}
{{- define "largebatch.childName" -}}
{{- $suffix := index . 1 -}}
{{- $base := include "largebatch.fullname" (index . 0) | trunc (int (sub 62 (len $suffix))) | trimSuffix "-" -}}
{{- printf "%s-%s" $base $suffix -}}
{{- end -}}

{{- define "largebatch.serviceAccountName" -}}
{{- default (include "largebatch.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "largebatch.labels" -}}
app.kubernetes.io/name: largebatch
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "largebatch.selector" -}}
app.kubernetes.io/name: largebatch
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* The kopf peering object the replicas share: one per release. */}}
{{- define "largebatch.peering" -}}
{{ include "largebatch.fullname" . }}
{{- end -}}

{{/* What the operator does inside a namespace it serves: a ClusterRole's rules when it serves every
namespace, a Role's in each of watchNamespaces. */}}
{{- define "largebatch.namespacedRules" -}}
# The jobs: watched, annotated by kopf (its progress storage), status written.
- apiGroups: [largebatch.io]
  resources: [largebatchjobs]
  verbs: [get, list, watch, patch]
# get and patch of the status are also what each job's trainer Role grants, which the operator can
# only create because it holds those rights itself.
- apiGroups: [largebatch.io]
  resources: [largebatchjobs/status]
  verbs: [get, patch]
# Rendezvous and worker pods: created, watched, deleted on scale-down, suspend and completion.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, delete]
# Per job: the job file, two Services and the trainer's status-only account.
- apiGroups: [""]
  resources: [configmaps, services, serviceaccounts]
  verbs: [create]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [create]
# A job whose checkpoint claim does not exist gets a condition instead of pods that never start.
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get]
# Events on the jobs.
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- if .Values.kueue.enabled }}
# Kueue: each job's Workloads, asked for, grown or shrunk (a pod set's count), given up when no longer
# wanted, and finished or handed back to the queue (their status).
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [list, create, patch, delete]
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads/status]
  verbs: [update]
{{- end }}
{{- end -}}

{{/* Stops the install when a Prometheus Operator object is asked for and the cluster lacks its CRDs:
the alternative, leaving it out, would leave the user believing the job is monitored. */}}
{{- define "largebatch.requirePrometheusOperator" -}}
{{- if not (.root.Capabilities.APIVersions.Has "monitoring.coreos.com/v1") -}}
{{- fail (printf "monitoring.%s.enabled is true but the cluster has no monitoring.coreos.com/v1 API: install the Prometheus Operator's CRDs first, or set monitoring.%s.enabled=false (with helm template, pass --api-versions monitoring.coreos.com/v1)" .key .key) -}}
{{- end -}}
{{- end -}}

{{- define "largebatch.monitoringLabels" -}}
{{ include "largebatch.labels" . }}
{{- with .Values.monitoring.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The operator's metrics Service: the ServiceMonitor's scrape job takes its name, and the
LargeBatchOperatorDown alert looks for that job. */}}
{{- define "largebatch.metricsService" -}}
{{ include "largebatch.childName" (list . "metrics") }}
{{- end -}}

{{/* operator.sharedNodes as LARGEBATCH_SHARED_NODES: `key=value,key=value`, keys in order. */}}
{{- define "largebatch.sharedNodes" -}}
{{- $pairs := list -}}
{{- range $key, $value := .Values.operator.sharedNodes -}}
{{- $pairs = append $pairs (printf "%s=%s" $key $value) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}
