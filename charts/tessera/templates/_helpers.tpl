{{/* Labels every object of the release carries: Tessera's own (as in manifests/) and Helm's. */}}
{{- define "tessera.labels" -}}
app.kubernetes.io/part-of: tessera
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end -}}

{{/* The image both components run. */}}
{{- define "tessera.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* imagePullSecrets, when any are set. */}}
{{- define "tessera.pullSecrets" -}}
{{- with .Values.image.pullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ if kindIs "string" . }}{{ . }}{{ else }}{{ .name }}{{ end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The agent's kubelet folders on the host. */}}
{{- define "tessera.registryDir" -}}
{{ trimSuffix "/" .Values.agent.kubeletRootDir }}/plugins_registry
{{- end -}}
{{- define "tessera.pluginDir" -}}
{{ trimSuffix "/" .Values.agent.kubeletRootDir }}/plugins/gpu.tessera.dev
{{- end -}}
{{- define "tessera.nicPluginDir" -}}
{{ trimSuffix "/" .Values.agent.kubeletRootDir }}/plugins/nic.tessera.dev
{{- end -}}
