{{- define "largebatch.fullname" -}}
{{- printf "%s-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
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
