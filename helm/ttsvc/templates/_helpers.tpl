{{/* Names and labels, as `helm create` makes them. */}}
{{- define "ttsvc.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ttsvc.fullname" -}}
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

{{- define "ttsvc.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ttsvc.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ttsvc.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "ttsvc.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "ttsvc.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ttsvc.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image: the cpu target by default, the gpu target's tag with gpu.enabled. */}}
{{- define "ttsvc.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion }}
{{- if .Values.gpu.enabled }}
{{- $tag = .Values.gpu.image.tag | default (printf "%s-gpu" .Chart.AppVersion) }}
{{- end }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}

{{/*
Seconds from the pod's deletion to SIGKILL: the preStop sleep, then the service's drain, then a
margin for workers to stop. Computed so that it can never be shorter than preStop + drain.
*/}}
{{- define "ttsvc.terminationGracePeriodSeconds" -}}
{{- $drain := 30 }}{{/* the service's own default */}}
{{- if hasKey .Values.settings "drain_grace_s" }}
{{- $drain = .Values.settings.drain_grace_s | float64 | ceil | int }}
{{- end }}
{{- add .Values.lifecycle.preStopSleepSeconds $drain .Values.lifecycle.shutdownMarginSeconds }}
{{- end }}

{{/*
Where the API key Secret is mounted: a directory of its own, so the kubelet's symlink swap on a
Secret update reaches the service (a subPath mount would keep the old file forever).
*/}}
{{- define "ttsvc.apiKeysDir" -}}
/etc/ttsvc/keys
{{- end }}

{{/* Where the lexicons' ConfigMap is mounted: apart from the engines, whose (read-only)
hostPath mount could not take a mount point inside it. */}}
{{- define "ttsvc.lexiconsDir" -}}
/etc/ttsvc/lexicons
{{- end }}

{{/* Checks the schema cannot express (it compares no two values). */}}
{{- define "ttsvc.validate" -}}
{{- if eq (int .Values.ports.http) (int .Values.ports.metrics) }}
{{- fail "ports.metrics must differ from ports.http: /metrics is not public" }}
{{- end }}
{{- with .Values.ports.wyoming }}
{{- if has (int .) (list (int $.Values.ports.http) (int $.Values.ports.metrics)) }}
{{- fail "ports.wyoming must differ from ports.http and ports.metrics" }}
{{- end }}
{{- end }}
{{- if gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas) }}
{{- fail "autoscaling.minReplicas must not exceed autoscaling.maxReplicas" }}
{{- end }}
{{- end }}
