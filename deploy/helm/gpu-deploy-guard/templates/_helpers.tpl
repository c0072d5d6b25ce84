{{/* Name of the chart, or nameOverride. */}}
{{- define "gdg.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name of the objects: fullnameOverride, else the release name if it contains the chart name, else both. */}}
{{- define "gdg.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "gdg.labels" -}}
app.kubernetes.io/name: {{ include "gdg.name" . }}
app.kubernetes.io/part-of: gpu-deploy-guard
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Selector of the webhook pods (never changes between versions). */}}
{{- define "gdg.selector" -}}
app.kubernetes.io/name: {{ include "gdg.name" . }}
app.kubernetes.io/component: webhook
{{- end -}}

{{- define "gdg.tlsSecret" -}}
{{- default (printf "%s-tls" (include "gdg.fullname" .)) .Values.certificates.secretName -}}
{{- end -}}

{{/* <service>.<namespace>.svc: the name the API server checks in the serving certificate. */}}
{{- define "gdg.serviceDNS" -}}
{{- printf "%s.%s.svc" (include "gdg.fullname" .) .Release.Namespace -}}
{{- end -}}

{{- define "gdg.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The operator's service accounts, as CEL: request.userInfo.username starts with this. */}}
{{- define "gdg.operatorSAPrefix" -}}
{{- printf "system:serviceaccount:%s:" .Values.operatorNamespace -}}
{{- end -}}

{{/* The config file the webhook reads (config.yaml of the ConfigMap). */}}
{{- define "gdg.config" -}}
{{- $modes := dict "audit" "audit" "warn" "warn" "enforce" "enforce" -}}
mode: {{ get $modes .Values.enforcement }}
operatorNamespace: {{ .Values.operatorNamespace }}
{{- with .Values.operatorVersion }}
operatorVersion: {{ . | quote }}
{{- end }}
enforceOnCreate: {{ .Values.config.enforceOnCreate }}
rules:
{{- range $id, $action := .Values.config.rules }}
  {{ $id }}: {{ $action }}
{{- end }}
stuckAfter:
  pause: {{ .Values.config.stuckAfter.pause | quote }}
  driverUpgrade: {{ .Values.config.stuckAfter.driverUpgrade | quote }}
exemptions:
  usernames: {{ toJson .Values.config.exemptions.usernames }}
  groups: {{ toJson .Values.config.exemptions.groups }}
  serviceAccountNamespaces: {{ toJson (uniq (prepend .Values.config.exemptions.serviceAccountNamespaces .Values.operatorNamespace)) }}
{{- end -}}

{{/* CEL: at least one nvidia.com/gpu.deploy.* label is added, changed or removed (UPDATE only: reads oldObject). */}}
{{/*
A node that carries a deploy label gets, or loses, a taint other than the
condition taints controllers set and clear (node.kubernetes.io/*: not-ready,
unreachable, pressure, unschedulable; node.cloudprovider.kubernetes.io/*):
the DaemonSet controller may then stop re-creating or evict operand pods.
The node lifecycle controller's and kubelets' writes never match, nor does a
heartbeat. UPDATE only (oldObject is null on CREATE).
*/}}
{{- define "gdg.celChangesLastingTaint" -}}
has(object.metadata.labels) &&
object.metadata.labels.exists(k, k.startsWith('nvidia.com/gpu.deploy.')) &&
((has(object.spec) && has(object.spec.taints) &&
  object.spec.taints.exists(t,
    !t.key.startsWith('node.kubernetes.io/') &&
    !t.key.startsWith('node.cloudprovider.kubernetes.io/') &&
    !(has(oldObject.spec) && has(oldObject.spec.taints) &&
      oldObject.spec.taints.exists(o, o.key == t.key && o.effect == t.effect &&
        (has(o.value) ? o.value : '') == (has(t.value) ? t.value : '')))))
||
(has(oldObject.spec) && has(oldObject.spec.taints) &&
  oldObject.spec.taints.exists(o,
    !o.key.startsWith('node.kubernetes.io/') &&
    !o.key.startsWith('node.cloudprovider.kubernetes.io/') &&
    !(has(object.spec) && has(object.spec.taints) &&
      object.spec.taints.exists(t, t.key == o.key && t.effect == o.effect &&
        (has(o.value) ? o.value : '') == (has(t.value) ? t.value : ''))))))
{{- end -}}

{{- define "gdg.celChangesDeployLabel" -}}
(has(object.metadata.labels) &&
  object.metadata.labels.exists(k,
    k.startsWith('nvidia.com/gpu.deploy.') &&
    (!has(oldObject.metadata.labels) ||
     !(k in oldObject.metadata.labels) ||
     oldObject.metadata.labels[k] != object.metadata.labels[k])))
||
(has(oldObject.metadata.labels) &&
  oldObject.metadata.labels.exists(k,
    k.startsWith('nvidia.com/gpu.deploy.') &&
    (!has(object.metadata.labels) ||
     !(k in object.metadata.labels))))
{{- end -}}
