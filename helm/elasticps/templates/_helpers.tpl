{{/* The chart's name. */}}
{{- define "elasticps.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* A name for the release's objects: the release name, prefixed with the chart's name unless it already holds it. */}}
{{- define "elasticps.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The operator's objects: <fullname>-operator (elasticps-operator for a release named elasticps). */}}
{{- define "elasticps.operatorName" -}}
{{- printf "%s-operator" (include "elasticps.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "elasticps.selectorLabels" -}}
app.kubernetes.io/name: {{ include "elasticps.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "elasticps.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "elasticps.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "elasticps.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "elasticps.operatorName" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The rules of every namespace the operator watches: exactly the API calls it makes (see
manifests/rbac.yaml for who makes which; tests/api/test_manifests_files.py checks both agree).
*/}}
{{- define "elasticps.namespacedRules" -}}
- apiGroups: [elasticps.io]
  resources: [trainingjobs]
  verbs: [get, list, watch, patch, delete]
- apiGroups: [elasticps.io]
  resources: [trainingjobs/status]
  verbs: [patch]
- apiGroups: [elasticps.io]
  resources: [trainingjobs/finalizers]
  verbs: [update]
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch, create, delete, deletecollection]
- apiGroups: [""]
  resources: [services]
  verbs: [list, create]
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create, patch]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [list, create]
{{- if .Values.coscheduling.enabled }}
- apiGroups: [scheduling.x-k8s.io]
  resources: [podgroups]
  verbs: [create, patch, delete]
{{- end }}
{{- if .Values.kueue.enabled }}
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [get, list, watch, create]
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads/status]
  verbs: [update]
{{- end }}
{{- end }}

{{/* Cluster-scoped, granted only to an operator watching every namespace: kopf notices CRDs added or removed. */}}
{{- define "elasticps.clusterRules" -}}
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
{{- if .Values.kueue.enabled }}
- apiGroups: [kueue.x-k8s.io]
  resources: [resourceflavors, workloadpriorityclasses]
  verbs: [get]
{{- end }}
{{- end }}
