{{/* Names, labels and the guards every template shares. */}}

{{- define "loopd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "loopd.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else if contains (include "loopd.name" .) .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "loopd.name" .) | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The name of one component's objects: "<fullname>-server", "<fullname>-router", ... */}}
{{- define "loopd.component" -}}
{{- printf "%s-%s" (include "loopd.fullname" .root) .component -}}
{{- end -}}

{{- define "loopd.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "loopd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component (root, component). */}}
{{- define "loopd.selector" -}}
app.kubernetes.io/name: {{ include "loopd.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "loopd.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "loopd.authSecret" -}}
{{- default (printf "%s-auth" (include "loopd.fullname" .)) .Values.auth.existingSecret -}}
{{- end -}}

{{- define "loopd.serverURL" -}}
{{- printf "http://%s.%s.svc:%v" (include "loopd.fullname" .) .Release.Namespace .Values.server.service.port -}}
{{- end -}}

{{/* The refusals: settings that cannot work together. */}}
{{- define "loopd.validate" -}}
{{- if eq .Values.database.type "sqlite" -}}
{{- if gt (int .Values.server.replicas) 1 -}}
{{- fail (printf "server.replicas=%v needs database.type=postgresql: SQLite holds the state of exactly one replica" .Values.server.replicas) -}}
{{- end -}}
{{- if .Values.server.autoscaling.enabled -}}
{{- fail "server.autoscaling.enabled needs database.type=postgresql: SQLite holds the state of exactly one replica" -}}
{{- end -}}
{{- else if eq .Values.database.type "postgresql" -}}
{{- if not .Values.database.postgresql.existingSecret -}}
{{- fail "database.type=postgresql needs database.postgresql.existingSecret: a Secret whose key holds the DSN" -}}
{{- end -}}
{{- end -}}
{{- if and .Values.ingress.enabled .Values.ingress.tls.enabled (not .Values.ingress.tls.secretName) -}}
{{- fail "ingress.tls.enabled needs ingress.tls.secretName" -}}
{{- end -}}
{{- end -}}

{{/* The pod-level security context and the container-level one. */}}
{{- define "loopd.podSecurity" -}}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end -}}

{{- define "loopd.containerSecurity" -}}
securityContext:
  {{- toYaml .Values.securityContext | nindent 2 }}
{{- end -}}

{{/* The operators whose own token the server adopts: a list of (key, tokenKey, env) for the enabled ones with a key. */}}
{{- define "loopd.actorTokens" -}}
{{- $found := list -}}
{{- range $key := list "router" "longhorizon" -}}
{{- $tokenKey := index $.Values.auth (printf "%sTokenKey" $key) -}}
{{- if and (index $.Values $key).enabled $tokenKey -}}
{{- $found = append $found (dict "key" $key "tokenKey" $tokenKey "env" (printf "LOOPD_%s_TOKEN" (upper $key))) -}}
{{- end -}}
{{- end -}}
{{- if $.Values.metrics.serviceMonitor.enabled -}}
{{- $found = append $found (dict "key" "metrics" "tokenKey" $.Values.auth.metricsTokenKey "env" "LOOPD_METRICS_TOKEN") -}}
{{- end -}}
{{- toJson $found -}}
{{- end -}}

{{/* The OpenTelemetry environment of a component (nothing while tracing.otlpEndpoint is empty). */}}
{{- define "loopd.tracingEnv" -}}
{{- with .root.Values.tracing.otlpEndpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ . | quote }}
- name: OTEL_SERVICE_NAME
  value: {{ printf "loopd-%s" $.component | quote }}
{{- end }}
{{- end -}}
