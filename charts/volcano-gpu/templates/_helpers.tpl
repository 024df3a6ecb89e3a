{{/* Object names are fixed: the admission policies and the docs name them, and one release per
cluster is the only sensible count (two daemons on a node would fight over kubelet's sockets). */}}
{{- define "volcano-gpu.daemon" -}}volcano-gpu-deviceplugin{{- end }}
{{- define "volcano-gpu.extender" -}}volcano-gpu-extender{{- end }}

{{- define "volcano-gpu.daemonLabels" -}}
app.kubernetes.io/name: volcano-gpu-deviceplugin
app.kubernetes.io/part-of: volcano-gpu
{{- end }}

{{- define "volcano-gpu.extenderLabels" -}}
app.kubernetes.io/name: volcano-gpu-extender
app.kubernetes.io/part-of: volcano-gpu
{{- end }}

{{- define "volcano-gpu.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* Prometheus' pods, the one peer allowed to scrape. */}}
{{- define "volcano-gpu.prometheusPeer" -}}
- namespaceSelector:
    matchLabels:
      kubernetes.io/metadata.name: {{ .Values.networkPolicy.prometheus.namespace }}
  podSelector:
    matchLabels:
      {{- toYaml .Values.networkPolicy.prometheus.podLabels | nindent 6 }}
{{- end }}

{{/* "true" when some node's daemon runs MPS (vgpu.mode, or a node's entry in the HAMi node config
the chart writes): the DaemonSet then carries what MPS needs (docs/mps.md). MIG and MPS are vGPU
modes: set with another strategy they would silently do nothing, so they are refused. */}}
{{- define "volcano-gpu.mps" -}}
{{- $modes := list .Values.vgpu.mode }}
{{- if .Values.vgpu.upstreamConfigMaps }}
{{- range .Values.vgpu.nodes }}{{ $modes = append $modes (.mode | default "") }}{{ end }}
{{- end }}
{{- if and (ne .Values.strategy "vgpu") (or (has "mig" $modes) (has "mps" $modes)) }}
{{- fail (printf "vgpu.mode (or a vgpu.nodes mode) mig or mps needs strategy: vgpu, not %s" .Values.strategy) }}
{{- end }}
{{- if has "mps" $modes }}true{{ end }}
{{- end }}
