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

{{/* Where the voices sidecar reads the names to pull (the voices ConfigMap, a directory). */}}
{{- define "ttsvc.voicesDir" -}}
/etc/ttsvc/voices
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
{{- if include "ttsvc.seeds" . }}
{{- $mount := trimSuffix "/" .Values.engines.mountPath }}
{{- $image := trimSuffix "/" .Values.engines.imagePath }}
{{- if or (eq $mount $image) (hasPrefix (printf "%s/" $mount) $image) (hasPrefix (printf "%s/" $image) $mount) }}
{{- fail "engines.mountPath must lie apart from engines.imagePath: the volume mounted there would hide the image's engines it is seeded from" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Whether an init container copies the image's engines into the engines volume before the service
starts: on a per-pod or claimed volume (a node's directory is the node's), unless turned off or
the image is the gpu one (it ships no engines). Non-empty means yes.
*/}}
{{- define "ttsvc.seeds" -}}
{{- if and .Values.engines.seedFromImage (ne .Values.engines.storage "hostPath") (not .Values.gpu.enabled) }}true{{ end }}
{{- end }}

{{/* Whether every replica shares one engines volume (a Job publishes into it for all). */}}
{{- define "ttsvc.sharedEngines" -}}
{{- if ne .Values.engines.storage "perPod" }}true{{ end }}
{{- end }}

{{/* The PersistentVolumeClaim of engines.storage=pvc: an existing one, or the chart's. */}}
{{- define "ttsvc.enginesClaim" -}}
{{- .Values.engines.pvc.existingClaim | default (printf "%s-engines" (include "ttsvc.fullname" . | trunc 55 | trimSuffix "-")) }}
{{- end }}

{{/* The engines volume, the same in the Deployment and the voices Job. */}}
{{- define "ttsvc.enginesVolume" -}}
- name: engines
{{- if eq .Values.engines.storage "hostPath" }}
  hostPath:
    path: {{ .Values.engines.hostPath.path }}
    type: {{ .Values.engines.hostPath.type }}
{{- else if eq .Values.engines.storage "pvc" }}
  persistentVolumeClaim:
    claimName: {{ include "ttsvc.enginesClaim" . }}
{{- else }}
  emptyDir:
    sizeLimit: {{ .Values.engines.perPod.sizeLimit }}
{{- end }}
{{- end }}

{{/*
The pod-level securityContext of every pod the chart makes: Pod Security "restricted" (non-root,
seccomp RuntimeDefault); fsGroup makes a claimed or per-pod volume writable by the service's
group, so the seed, the voices Job and sidecar can publish into it (a hostPath is not changed by
the kubelet: its owner on the node must allow the user).
*/}}
{{- define "ttsvc.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.securityContext.runAsUser }}
runAsGroup: {{ .Values.securityContext.runAsGroup }}
fsGroup: {{ .Values.securityContext.runAsGroup }}
# only the volume's root is checked: a chown of every engine file at each start is slow
fsGroupChangePolicy: OnRootMismatch
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Every container's securityContext: Pod Security "restricted", and a read-only root. */}}
{{- define "ttsvc.containerSecurityContext" -}}
runAsNonRoot: true
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}
