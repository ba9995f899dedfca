{{/* Name of the chart, overridable. */}}
{{- define "gang-autoscaler.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name of the release's objects. */}}
{{- define "gang-autoscaler.fullname" -}}
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

{{- define "gang-autoscaler.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gang-autoscaler.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gang-autoscaler.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "gang-autoscaler.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: controller
{{- end }}

{{- define "gang-autoscaler.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gang-autoscaler.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The balloon PriorityClass name is a contract with the service (DESIGN section 7). */}}
{{- define "gang-autoscaler.balloonPriorityClassName" -}}
gang-autoscaler-balloon
{{- end }}

{{/* Seconds in a Go-style duration ("1m30s", "500ms"); the schema has checked its form. */}}
{{- define "gang-autoscaler.durationSeconds" -}}
{{- $unitSeconds := dict "ns" 0.000000001 "us" 0.000001 "µs" 0.000001 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 }}
{{- $total := 0.0 }}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h)" . -1 }}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" . }}
{{- $total = addf $total (mulf (float64 $number) (get $unitSeconds (trimPrefix $number .))) }}
{{- end }}
{{- $total }}
{{- end }}

{{/*
Rules of autoscaler/service/settings.py that JSON Schema cannot express: without them the
install succeeds and the pods crash-loop on start-up. Included by the settings ConfigMap.
*/}}
{{- define "gang-autoscaler.validateValues" -}}
{{- $lease := .Values.leaderElection.leaseDuration }}
{{- if lt (float64 (include "gang-autoscaler.durationSeconds" $lease)) 3.0 }}
{{- fail (printf "leaderElection.leaseDuration %q is below 3s, the shortest Lease the service accepts" $lease) }}
{{- end }}
{{- if gt (int .Values.buffer.minGangs) (int .Values.buffer.maxGangs) }}
{{- fail (printf "buffer.minGangs (%d) is above buffer.maxGangs (%d)" (int .Values.buffer.minGangs) (int .Values.buffer.maxGangs)) }}
{{- end }}
{{- end }}
