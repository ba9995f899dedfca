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
{{- /* Helm takes release names Service names refuse (a leading digit, dots) */}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" .Release.Name) }}
{{- fail (printf "release name %q does not make valid object names (a lowercase letter first, then letters, digits and '-'); set fullnameOverride" .Release.Name) }}
{{- end }}
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
{{- else if .Values.serviceAccount.name }}
{{- .Values.serviceAccount.name }}
{{- else }}
{{- /* binding the namespace's `default` account would give its every pod these grants */}}
{{- fail "serviceAccount.create is false: set serviceAccount.name to the ServiceAccount the service runs as" }}
{{- end }}
{{- end }}

{{/* The balloon PriorityClass name is a contract with the service (DESIGN section 7). */}}
{{- define "gang-autoscaler.balloonPriorityClassName" -}}
gang-autoscaler-balloon
{{- end }}

{{/* Seconds in a Go-style or Prometheus duration ("1m30s", "500ms", "1d"); the schema has checked its form. */}}
{{- define "gang-autoscaler.durationSeconds" -}}
{{- $unitSeconds := dict "ns" 0.000000001 "us" 0.000001 "µs" 0.000001 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 "d" 86400.0 "w" 604800.0 "y" 31536000.0 }}
{{- $total := 0.0 }}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h|d|w|y)" . -1 }}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" . }}
{{- $total = addf $total (mulf (float64 $number) (get $unitSeconds (trimPrefix $number .))) }}
{{- end }}
{{- $total }}
{{- end }}

{{/*
The files the service reads its Prometheus credentials from (empty: none). A Secret or
ConfigMap given in the values is mounted, read-only and with only its one key, at a fixed
path, one directory per volume under /var/run/secrets (beside the ServiceAccount token, not
inside the read-only config volume); a path given as a value is used as it is.
*/}}
{{- define "gang-autoscaler.prometheusBearerTokenFile" -}}
{{- if .Values.prometheus.bearerTokenSecret.name -}}
/var/run/secrets/gang-autoscaler/prometheus/bearer-token/token
{{- else -}}
{{- .Values.prometheus.bearerTokenFile }}
{{- end }}
{{- end }}

{{- define "gang-autoscaler.prometheusBasicAuthPasswordFile" -}}
{{- if .Values.prometheus.basicAuth.passwordSecret.name -}}
/var/run/secrets/gang-autoscaler/prometheus/basic-auth/password
{{- end }}
{{- end }}

{{- define "gang-autoscaler.prometheusCAFile" -}}
{{- if or .Values.prometheus.caBundle.configMap .Values.prometheus.caBundle.secret -}}
/var/run/secrets/gang-autoscaler/prometheus/ca/ca.crt
{{- else -}}
{{- .Values.prometheus.caFile }}
{{- end }}
{{- end }}

{{/*
Rules of autoscaler/service/settings.py that JSON Schema cannot express: without them the
install succeeds and the pods crash-loop on start-up. Included by the settings ConfigMap.
*/}}
{{- define "gang-autoscaler.validateValues" -}}
{{- $durations := dict "tick" .Values.tick "watchStalenessLimit" .Values.watchStalenessLimit "prometheus.timeout" .Values.prometheus.timeout "prometheus.stalenessLimit" .Values.prometheus.stalenessLimit "prometheus.demandWindow" .Values.prometheus.demandWindow }}
{{- range $name, $duration := $durations }}
{{- if lt (float64 (include "gang-autoscaler.durationSeconds" $duration)) 0.001 }}
{{- fail (printf "%s %q is shorter than 1ms, the shortest duration the service accepts" $name $duration) }}
{{- end }}
{{- end }}
{{- /* a key the chart sets itself would be written twice in the pod template: the last
wins, and a selector label overridden orphans the Deployment's pods */}}
{{- range $key := list "app.kubernetes.io/name" "app.kubernetes.io/instance" }}
{{- if hasKey $.Values.podLabels $key }}
{{- fail (printf "podLabels sets %s, which the chart's selector sets; leave it out" $key) }}
{{- end }}
{{- end }}
{{- if hasKey .Values.podAnnotations "checksum/config" }}
{{- fail "podAnnotations sets checksum/config, which the chart sets to roll the pods on a settings change; leave it out" }}
{{- end }}
{{- $lease := .Values.leaderElection.leaseDuration }}
{{- if lt (float64 (include "gang-autoscaler.durationSeconds" $lease)) 3.0 }}
{{- fail (printf "leaderElection.leaseDuration %q is below 3s, the shortest Lease the service accepts" $lease) }}
{{- end }}
{{- if gt (float64 (include "gang-autoscaler.durationSeconds" $lease)) 3600.0 }}
{{- fail (printf "leaderElection.leaseDuration %q is over 1h, the longest Lease the service accepts" $lease) }}
{{- end }}
{{- if gt (int .Values.buffer.minGangs) (int .Values.buffer.maxGangs) }}
{{- fail (printf "buffer.minGangs (%d) is above buffer.maxGangs (%d)" (int .Values.buffer.minGangs) (int .Values.buffer.maxGangs)) }}
{{- end }}
{{- include "gang-autoscaler.validatePrometheusAuth" . }}
{{- include "gang-autoscaler.validateScrapeIntervals" . }}
{{- end }}

{{/*
Scrape settings prometheus-operator or the signal queries cannot use. A ServiceMonitor whose
scrapeTimeout is above its interval is dropped by the operator with only a log line, and the
service's series (dashboards, the learned capacity a restart reads back) silently stop; the
demand queries take rate(...[1m]), which needs two vLLM samples a minute.
*/}}
{{- define "gang-autoscaler.validateScrapeIntervals" -}}
{{- with .Values.serviceMonitor }}
{{- if and .enabled (gt (float64 (include "gang-autoscaler.durationSeconds" .scrapeTimeout)) (float64 (include "gang-autoscaler.durationSeconds" .interval))) }}
{{- fail (printf "serviceMonitor.scrapeTimeout %q is above serviceMonitor.interval %q; prometheus-operator drops such a ServiceMonitor" .scrapeTimeout .interval) }}
{{- end }}
{{- end }}
{{- if and .Values.prometheusRule.enabled (not .Values.serviceMonitor.enabled) (not .Values.prometheusRule.job) }}
{{- fail "prometheusRule.enabled: the alerts read the service's own series, and nothing in this release has Prometheus scrape them (GangAutoscalerDown would fire for good); set serviceMonitor.enabled=true, or prometheusRule.job to the job of the scrape config that does" }}
{{- end }}
{{- with .Values.vllmPodMonitor }}
{{- if and .enabled (gt (float64 (include "gang-autoscaler.durationSeconds" .interval)) 30.0) }}
{{- fail (printf "vllmPodMonitor.interval %q is above 30s: the demand queries' rate(...[1m]) needs two samples a minute" .interval) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
One source per credential, and one Authorization header: the service refuses two at start-up
(PrometheusCredentials), so the chart names the values instead.
*/}}
{{- define "gang-autoscaler.validatePrometheusAuth" -}}
{{- $prometheus := .Values.prometheus }}
{{- $basicAuth := $prometheus.basicAuth }}
{{- if and $prometheus.bearerTokenFile $prometheus.bearerTokenSecret.name }}
{{- fail "prometheus.bearerTokenFile and prometheus.bearerTokenSecret.name both give the bearer token; set one" }}
{{- end }}
{{- if and $basicAuth.username (not $basicAuth.passwordSecret.name) }}
{{- fail "prometheus.basicAuth.username is set without prometheus.basicAuth.passwordSecret.name; basic auth needs both" }}
{{- end }}
{{- if and $basicAuth.passwordSecret.name (not $basicAuth.username) }}
{{- fail "prometheus.basicAuth.passwordSecret.name is set without prometheus.basicAuth.username; basic auth needs both" }}
{{- end }}
{{- $bearer := "" }}
{{- if $prometheus.bearerTokenSecret.name }}
{{- $bearer = "prometheus.bearerTokenSecret" }}
{{- else if $prometheus.bearerTokenFile }}
{{- $bearer = "prometheus.bearerTokenFile" }}
{{- end }}
{{- if and $bearer $basicAuth.username }}
{{- fail (printf "prometheus.basicAuth and %s both set the Authorization header; use one" $bearer) }}
{{- end }}
{{- $authorization := $bearer }}
{{- if $basicAuth.username }}
{{- $authorization = "prometheus.basicAuth" }}
{{- end }}
{{- $spellings := dict }}
{{- range $name, $value := $prometheus.headers }}
{{- if and $authorization (eq (lower $name) "authorization") }}
{{- fail (printf "prometheus.headers sets %s, and so does %s; use one" $name $authorization) }}
{{- end }}
{{- /* values land in the ConfigMap, readable by anyone who may view the namespace */}}
{{- if eq (lower $name) "authorization" }}
{{- fail (printf "prometheus.headers sets %s, a credential the ConfigMap would hold in plain text; use prometheus.bearerTokenSecret or prometheus.basicAuth, or extraEnv GANG_AUTOSCALER_PROMETHEUS_HEADERS__Authorization from a Secret (valueFrom.secretKeyRef)" $name) }}
{{- end }}
{{- /* header names are case-insensitive: two spellings would go out as one header */}}
{{- with get $spellings (lower $name) }}
{{- fail (printf "prometheus.headers names one header twice: %s and %s" . $name) }}
{{- end }}
{{- $_ := set $spellings (lower $name) $name }}
{{- if regexMatch "[\r\n]" (toString $value) }}
{{- fail (printf "prometheus.headers: line break in the value of %s" $name) }}
{{- end }}
{{- /* the service refuses it at start (requests would refuse it on every query); the
class is Python's isspace(): RE2's \s alone misses no-break and other Unicode spaces */}}
{{- if regexMatch "^[\\s\\v\\x{1c}-\\x{1f}\\x{85}\\p{Z}]" (toString $value) }}
{{- fail (printf "prometheus.headers: leading whitespace in the value of %s" $name) }}
{{- end }}
{{- /* requests sends header values as Latin-1: anything else failed every query */}}
{{- if regexMatch "[^\\x{0}-\\x{ff}]" (toString $value) }}
{{- fail (printf "prometheus.headers: characters an HTTP header cannot carry (outside Latin-1) in the value of %s" $name) }}
{{- end }}
{{- end }}
{{- if regexMatch "[^\\x{0}-\\x{ff}]" (toString $prometheus.basicAuth.username) }}
{{- fail "prometheus.basicAuth.username: a character outside Latin-1 cannot be sent in basic auth" }}
{{- end }}
{{- /* user:password@ in the URL: stored in the Deployment's args in plain text, and the
service refuses it at start. The message does not echo the URL. */}}
{{- if regexMatch "^[a-zA-Z][a-zA-Z0-9+.-]*://[^/?#]*@" $prometheus.url }}
{{- fail "prometheus.url has credentials in it (user:password@): they would be stored in the Deployment in plain text, and the service refuses such a URL; use prometheus.basicAuth with a Secret" }}
{{- end }}
{{- /* as the service checks it at start: a host, and a port that is a number (http://prom:abc
and http://:9090 passed the schema's pattern, then the pod crash-looped) */}}
{{- if not (regexMatch "^https?://(\\[[0-9a-fA-F:.]+\\]|[^\\s\\v\\x{85}\\p{Z}/?#:\\[\\]@]+)(:(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5]?[0-9]{1,4})?)?([/?#].*)?$" $prometheus.url) }}
{{- fail "prometheus.url needs a host and, if given, a port from 0 to 65535: http://HOST:PORT" }}
{{- end }}
{{- $caBundle := $prometheus.caBundle }}
{{- if and $caBundle.configMap $caBundle.secret }}
{{- fail "prometheus.caBundle.configMap and prometheus.caBundle.secret both give the CA bundle; set one" }}
{{- end }}
{{- if and $prometheus.caFile (or $caBundle.configMap $caBundle.secret) }}
{{- fail "prometheus.caFile and prometheus.caBundle both give the CA bundle; set one" }}
{{- end }}
{{- end }}
