{{/* The release's name, or release-chart, cut to 63 characters. */}}
{{- define "seckill.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "seckill.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component (api, worker, nginx): pass (list $ "api"). */}}
{{- define "seckill.selector" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ $.Chart.Name }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* The Secret the settings with credentials come from. */}}
{{- define "seckill.secretName" -}}
{{- .Values.existingSecret | default (include "seckill.fullname" .) -}}
{{- end -}}

{{/* The image of both roles. */}}
{{- define "seckill.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/*
The settings that hold credentials: they belong in the Secret, never in the
ConfigMap. SECKILL_ROLE and SECKILL_ADDR are the chart's own.
*/}}
{{- define "seckill.secretSettings" -}}
SECKILL_TOKEN_SECRET SECKILL_MYSQL_DSN SECKILL_REDIS_URL SECKILL_LOCK_NODES SECKILL_PAY_WEBHOOK_SECRET SECKILL_LOGIN_WEBHOOK_SECRET
{{- end -}}

{{/*
One role's pod spec: pass (list $ "api") or (list $ "worker"). Both roles
run the same image and settings and answer the same probes on port; only
SECKILL_ROLE differs.
*/}}
{{- define "seckill.podSpec" -}}
{{- $ := index . 0 -}}
{{- $role := index . 1 -}}
{{- $v := index $.Values $role -}}
{{- with $.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
terminationGracePeriodSeconds: {{ $.Values.terminationGracePeriodSeconds }}
automountServiceAccountToken: false
securityContext:
  runAsNonRoot: true
  runAsUser: 10001
  runAsGroup: 10001
  seccompProfile:
    type: RuntimeDefault
containers:
  - name: seckill
    image: {{ include "seckill.image" $ | quote }}
    imagePullPolicy: {{ $.Values.image.pullPolicy }}
    args: ["serve"]
    env:
      - name: SECKILL_ROLE
        value: {{ $role | quote }}
    envFrom:
      - configMapRef:
          name: {{ include "seckill.fullname" $ }}
      - secretRef:
          name: {{ include "seckill.secretName" $ }}
    ports:
      - name: http
        containerPort: {{ $.Values.port }}
        protocol: TCP
    # Start-up connects to Redis and the database and applies migrations
    # (on MySQL one instance at a time): up to three minutes before liveness.
    startupProbe:
      httpGet:
        path: /healthz
        port: http
      periodSeconds: 2
      failureThreshold: 90
    livenessProbe:
      httpGet:
        path: /healthz
        port: http
      periodSeconds: 10
      timeoutSeconds: 3
      failureThreshold: 3
    # 503 while Redis, a cluster master, a shard's sale state, the database
    # or its schema is not there (each check bounded at one second).
    readinessProbe:
      httpGet:
        path: /readyz
        port: http
      periodSeconds: 2
      timeoutSeconds: 3
      failureThreshold: 2
    {{- if eq $role "api" }}
    lifecycle:
      preStop:
        exec:
          command: ["sleep", "{{ $.Values.preStopSeconds }}"]
    {{- end }}
    resources:
      {{- toYaml $v.resources | nindent 6 }}
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities:
        drop: ["ALL"]
    volumeMounts:
      - name: tmp
        mountPath: /tmp
volumes:
  - name: tmp
    emptyDir: {}
{{- with $v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Pod annotations of one role: settings' checksums and Prometheus's. */}}
{{- define "seckill.podAnnotations" -}}
checksum/config: {{ include (print .Template.BasePath "/configmap.yaml") . | sha256sum }}
{{- if not .Values.existingSecret }}
checksum/secret: {{ include (print .Template.BasePath "/secret.yaml") . | sha256sum }}
{{- end }}
{{- if .Values.metrics.annotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end -}}

{{/*
nginx's set_real_ip_from lines (SECKILL_NGINX_REAL_IP_FROM): podNetwork when
an Ingress controller is in front, and nginx.realIP.from. Each must be an
address or CIDR: the value is nginx configuration.
*/}}
{{- define "seckill.nginxRealIPFrom" -}}
{{- $from := .Values.nginx.realIP.from | default list -}}
{{- if .Values.nginx.realIP.ingress -}}
{{- $from = concat .Values.podNetwork $from -}}
{{- end -}}
{{- $lines := list -}}
{{- range $from -}}
{{- if not (regexMatch "^[0-9A-Fa-f.:]+(/[0-9]{1,3})?$" (toString .)) -}}
{{- fail (printf "nginx.realIP.from and podNetwork take addresses or CIDRs, not %q" (toString .)) -}}
{{- end -}}
{{- $lines = append $lines (printf "set_real_ip_from %s;" .) -}}
{{- end -}}
{{- join " " $lines -}}
{{- end -}}

{{/* nginx.hstsMaxAge, seconds (SECKILL_NGINX_HSTS_MAX_AGE). */}}
{{- define "seckill.hstsMaxAge" -}}
{{- $age := .Values.nginx.hstsMaxAge -}}
{{- if kindIs "float64" $age -}}
{{- $age = printf "%.0f" $age -}}
{{- end -}}
{{- $age = toString $age -}}
{{- if not (regexMatch "^[0-9]+$" $age) -}}
{{- fail (printf "nginx.hstsMaxAge takes seconds, not %q" $age) -}}
{{- end -}}
{{- $age -}}
{{- end -}}
