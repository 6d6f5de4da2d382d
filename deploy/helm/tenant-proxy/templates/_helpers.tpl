{{- define "tenant-proxy.name" -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tenant-proxy.selectorLabels" -}}
app.kubernetes.io/name: tenant-proxy
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tenant-proxy.labels" -}}
{{ include "tenant-proxy.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tenant-proxy.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The proxy's config.yaml. */}}
{{- define "tenant-proxy.config" -}}
{{- $config := dict
      "listen" "0.0.0.0:8080"
      "admin_listen" "0.0.0.0:8081"
      "tenants_file" "/var/run/tenant-proxy/tenants.yaml" -}}
{{- with .Values.logs.upstream }}
{{- $_ := set $config "logs" (dict "upstream" .) }}
{{- end }}
{{- with .Values.metrics.upstream }}
{{- $metrics := dict "upstream" . "mode" $.Values.metrics.mode -}}
{{- if eq $.Values.metrics.mode "label" }}
{{- $_ := set $metrics "label" $.Values.metrics.label }}
{{- $_ := set $metrics "foreign_label" $.Values.metrics.foreignLabel }}
{{- $_ := set $metrics "query_cache_size" (int $.Values.metrics.queryCacheSize) }}
{{- $_ := set $metrics "otlp_forward_encoding" $.Values.metrics.otlpForwardEncoding }}
{{- $_ := set $metrics "remote_write_forward_compression" $.Values.metrics.remoteWriteForwardCompression }}
{{- else }}
{{- $_ := set $metrics "header" $.Values.metrics.header }}
{{- end }}
{{- with $.Values.metrics.pushUpstream }}
{{- $_ := set $metrics "push_upstream" . }}
{{- end }}
{{- $_ := set $config "metrics" $metrics }}
{{- end }}
{{- with .Values.alerts.upstream }}
{{- if not $.Values.metrics.upstream }}
{{- fail "alerts.upstream is scoped like the metrics: set metrics.upstream too" }}
{{- end }}
{{- $_ := set $config "alerts" (dict "upstream" .) }}
{{- end }}
{{- $_ := set $config "limits" (dict "max_large_body_bytes_held" (int64 .Values.largeBodyBytesHeld) "max_concurrent_requests" (int64 .Values.maxConcurrentRequests) "max_http2_streams" (int64 .Values.maxHttp2Streams) "upstream_receive_buffer_bytes" (int64 .Values.upstreamReceiveBufferBytes)) }}
{{- /* More than one replica: each enforces its share of a tenant's limits. */}}
{{- if or (gt (int .Values.replicas) 1) .Values.autoscaling.enabled }}
{{- $_ := set $config "tenant_limits" (dict "scope" "global") }}
{{- end }}
{{- toYaml (mergeOverwrite $config .Values.extraConfig) }}
{{- end -}}
