{{/* Chart name, cut to the 63 characters a label value allows. */}}
{{- define "leaderd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-scoped name of every object; also the default election name. */}}
{{- define "leaderd.fullname" -}}
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

{{- define "leaderd.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "leaderd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "leaderd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "leaderd.labels" -}}
helm.sh/chart: {{ include "leaderd.chart" . }}
{{ include "leaderd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "leaderd.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "leaderd.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository[:tag][@digest] from an image block; tag falls back to $default. */}}
{{- define "leaderd.imageRef" -}}
{{- $image := index . 0 }}
{{- $default := index . 1 }}
{{- $ref := printf "%s:%s" $image.repository (default $default $image.tag) }}
{{- if $image.digest }}
{{- $ref = printf "%s@%s" $ref $image.digest }}
{{- end }}
{{- $ref }}
{{- end }}

{{/* Where the config file is mounted; the same path in both patterns. */}}
{{- define "leaderd.configPath" -}}
/etc/leaderd/leaderd.toml
{{- end }}

{{- define "leaderd.sqliteDir" -}}
{{- dir .Values.config.store.path }}
{{- end }}

{{/* host:port for [http] listen; IPv6 literals get brackets. */}}
{{- define "leaderd.listen" -}}
{{- $host := .Values.config.http.listenAddress }}
{{- if contains ":" $host }}
{{- printf "[%s]:%d" $host (int .Values.leaderd.port) }}
{{- else }}
{{- printf "%s:%d" $host (int .Values.leaderd.port) }}
{{- end }}
{{- end }}

{{/*
Environment every leaderd gets: its identity from the pod name (unless set
in the config file, which env would override), and the admin token and the
PostgreSQL URL from Secrets.
*/}}
{{- define "leaderd.env" -}}
{{- if not .Values.config.identity }}
- name: LEADERD_IDENTITY
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- end }}
{{- if not .Values.config.http.advertise }}
# Where other pods reach this one: written into the lease record while it
# leads.
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: LEADERD_HTTP__ADVERTISE
  value: "$(POD_IP):{{ .Values.leaderd.port }}"
{{- end }}
{{- if eq .Values.config.store.kind "postgres" }}
- name: LEADERD_STORE__URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.config.store.urlSecret.name }}
      key: {{ .Values.config.store.urlSecret.key }}
{{- end }}
{{- with .Values.config.http.adminTokenSecret.name }}
- name: LEADERD_HTTP__ADMIN_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.config.http.adminTokenSecret.key }}
{{- end }}
{{- with .Values.leaderd.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The leaderd port and probes, for whichever container runs leaderd. */}}
{{- define "leaderd.portAndProbes" -}}
{{- $r := .Values.leaderd.readinessProbe }}
{{- $l := .Values.leaderd.livenessProbe }}
{{- if $r.enabled }}
readinessProbe:
  httpGet:
    path: /leader
    port: leaderd
  periodSeconds: {{ $r.periodSeconds }}
  timeoutSeconds: {{ $r.timeoutSeconds }}
  failureThreshold: {{ $r.failureThreshold }}
{{- end }}
{{- if $l.enabled }}
livenessProbe:
  httpGet:
    path: /healthz
    port: leaderd
  periodSeconds: {{ $l.periodSeconds }}
  timeoutSeconds: {{ $l.timeoutSeconds }}
  failureThreshold: {{ $l.failureThreshold }}
{{- end }}
{{- end }}

{{/*
Mounts every leaderd needs: its config and, for sqlite, a writable dir;
for postgres, the CA certificate when one is given.
*/}}
{{- define "leaderd.mounts" -}}
- name: leaderd-config
  mountPath: /etc/leaderd
  readOnly: true
{{- if eq .Values.config.store.kind "sqlite" }}
- name: leaderd-state
  mountPath: {{ include "leaderd.sqliteDir" . }}
{{- end }}
{{- if include "leaderd.postgresCa" . }}
- name: leaderd-postgres-ca
  mountPath: /etc/leaderd-postgres-ca
  readOnly: true
{{- end }}
{{- end }}

{{/* The CA file leaderd verifies PostgreSQL with, if one is given. */}}
{{- define "leaderd.postgresCa" -}}
{{- if and (eq .Values.config.store.kind "postgres") .Values.config.store.caSecret.name }}
{{- printf "/etc/leaderd-postgres-ca/%s" .Values.config.store.caSecret.key }}
{{- end }}
{{- end }}

{{/*
A duration as leaderd reads it ("10s", "1m 30s", "1500ms") in whole
milliseconds; units below a millisecond count as 0.
*/}}
{{- define "leaderd.durationMs" -}}
{{- $units := dict "ms" 1 "s" 1000 "sec" 1000 "m" 60000 "min" 60000 "h" 3600000 "hr" 3600000 "d" 86400000 "w" 604800000 }}
{{- $total := 0 }}
{{- range regexFindAll "[0-9]+ ?[a-z]+" . -1 }}
{{- $n := regexFind "^[0-9]+" . | atoi }}
{{- $unit := regexFind "[a-z]+$" . }}
{{- $total = add $total (mul $n (get $units $unit | default 0)) }}
{{- end }}
{{- $total }}
{{- end }}

{{/*
`for` of the LeaderdNoLeader alert: prometheusRule.noLeaderFor, or twice the
longest lease of the configured elections, in whole seconds.
*/}}
{{- define "leaderd.noLeaderFor" -}}
{{- if .Values.prometheusRule.noLeaderFor }}
{{- .Values.prometheusRule.noLeaderFor }}
{{- else }}
{{- $longest := include "leaderd.durationMs" .Values.config.lease.duration | atoi }}
{{- range .Values.config.elections }}
{{- with .duration }}
{{- $longest = max $longest (include "leaderd.durationMs" . | atoi) }}
{{- end }}
{{- end }}
{{- printf "%ds" (div (add (mul $longest 2) 999) 1000) }}
{{- end }}
{{- end }}

{{/* The volume of the PostgreSQL CA certificate, if one is given. */}}
{{- define "leaderd.postgresCaVolume" -}}
{{- if include "leaderd.postgresCa" . }}
- name: leaderd-postgres-ca
  secret:
    secretName: {{ .Values.config.store.caSecret.name }}
    items:
      - key: {{ .Values.config.store.caSecret.key }}
        path: {{ .Values.config.store.caSecret.key }}
{{- end }}
{{- end }}
