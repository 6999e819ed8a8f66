{{/*
Shared pieces of the evalstream chart. Every container is configured only through the
environment variables of libs/common/evalstream/common/settings.py.
*/}}

{{/* HTTP port of each service (settings.SERVICE_PORTS): /healthz, /readyz, /metrics. */}}
{{- define "evalstream.port" -}}
{{- get (dict "producer" 8101 "router" 8102 "aggregator" 8104 "worker" 8110) . -}}
{{- end -}}

{{- define "evalstream.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "evalstream.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "evalstream.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Selector labels: (dict "root" $ "component" "worker" "group" "gpu-a") */}}
{{- define "evalstream.selectorLabels" -}}
app.kubernetes.io/name: evalstream
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- if .group }}
evalstream.dev/worker-group: {{ .group }}
{{- end }}
{{- end -}}

{{- define "evalstream.labels" -}}
{{ include "evalstream.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Values.image.tag | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{- define "evalstream.image" -}}
{{- $img := .root.Values.image -}}
{{- if $img.registry -}}
{{- printf "%s/%s/%s:%s" $img.registry $img.repository .image $img.tag -}}
{{- else -}}
{{- printf "%s/%s:%s" $img.repository .image $img.tag -}}
{{- end -}}
{{- end -}}

{{/* Kafka: the broker, the topic prefix and, with SASL, this service's own principal.
     (dict "root" $ "principal" "worker") */}}
{{- define "evalstream.kafkaEnv" -}}
{{- $kafka := .root.Values.kafka }}
- name: KAFKA_BOOTSTRAP
  value: {{ $kafka.bootstrap | quote }}
{{- if $kafka.topicPrefix }}
- name: KAFKA_TOPIC_PREFIX
  value: {{ $kafka.topicPrefix | quote }}
{{- end }}
- name: KAFKA_PARTITIONS_WORK
  value: {{ $kafka.workPartitions | quote }}
{{- range $topic := list "jobs" "shards" "results" "retry" "dlq" }}
- name: KAFKA_PARTITIONS_{{ upper $topic }}
  value: {{ get $kafka.partitions $topic | quote }}
{{- end }}
{{- if $kafka.sasl.enabled }}
{{- $user := required (printf "kafka.sasl.users.%s is required when kafka.sasl.enabled" .principal) (get $kafka.sasl.users .principal) }}
- name: KAFKA_SECURITY_PROTOCOL
  value: {{ $kafka.sasl.securityProtocol | quote }}
- name: KAFKA_SASL_MECHANISM
  value: {{ $kafka.sasl.mechanism | quote }}
- name: KAFKA_USERNAME
  value: {{ $user.username | quote }}
- name: KAFKA_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $user.secretName }}
      key: {{ $user.passwordKey }}
{{- if $kafka.sasl.caSecret.name }}
- name: KAFKA_SSL_CAFILE
  value: /etc/evalstream/kafka-ca/{{ $kafka.sasl.caSecret.key }}
{{- end }}
{{- end }}
{{- end -}}

{{/* A component's own database role (db_roles.py). (dict "root" $ "component" "producer") */}}
{{- define "evalstream.databaseEnv" -}}
{{- $db := .root.Values.database }}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ required (printf "database.secretNames.%s is required" .component) (get $db.secretNames .component) }}
      key: {{ $db.urlKey }}
{{- end -}}

{{/* The store, with a component's own key pair (s3_identities.py). (dict "root" $ "component" "producer") */}}
{{- define "evalstream.s3Env" -}}
{{- $s3 := .root.Values.s3 }}
{{- $secret := required (printf "s3.secretNames.%s is required" .component) (get $s3.secretNames .component) }}
- name: S3_ENDPOINT
  value: {{ $s3.endpoint | quote }}
- name: S3_REGION
  value: {{ $s3.region | quote }}
- name: S3_BUCKET_DATASETS
  value: {{ $s3.bucketDatasets | quote }}
- name: S3_BUCKET_RESULTS
  value: {{ $s3.bucketResults | quote }}
- name: S3_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $s3.accessKeyKey }}
- name: S3_SECRET_KEY
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $s3.secretKeyKey }}
{{- end -}}

{{/* What every service reads: HTTP address, logs, traces. (dict "root" $ "component" "router") */}}
{{- define "evalstream.serviceEnv" -}}
- name: HTTP_HOST
  value: "0.0.0.0"
- name: HTTP_PORT
  value: {{ include "evalstream.port" .component | quote }}
- name: LOG_LEVEL
  value: {{ .root.Values.logLevel | quote }}
{{- if .root.Values.otelEndpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .root.Values.otelEndpoint | quote }}
{{- end }}
{{- end -}}

{{/* A component's further settings (values `env`), sorted by name. */}}
{{- define "evalstream.extraEnv" -}}
{{- range $name, $value := . }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end -}}

{{/* The Kafka CA bundle for SASL_SSL, when named. */}}
{{- define "evalstream.kafkaCaVolumeMount" -}}
{{- if and .Values.kafka.sasl.enabled .Values.kafka.sasl.caSecret.name }}
- name: kafka-ca
  mountPath: /etc/evalstream/kafka-ca
  readOnly: true
{{- end }}
{{- end -}}

{{- define "evalstream.kafkaCaVolume" -}}
{{- if and .Values.kafka.sasl.enabled .Values.kafka.sasl.caSecret.name }}
- name: kafka-ca
  secret:
    secretName: {{ .Values.kafka.sasl.caSecret.name }}
    items:
      - key: {{ .Values.kafka.sasl.caSecret.key }}
        path: {{ .Values.kafka.sasl.caSecret.key }}
{{- end }}
{{- end -}}

{{/* Liveness on /healthz, readiness on /readyz, with the chart's numbers and the
     component's overrides. (dict "root" $ "probes" .probes) */}}
{{- define "evalstream.probes" -}}
{{- $p := merge (deepCopy (.probes | default dict)) .root.Values.probes }}
livenessProbe:
  httpGet: {path: /healthz, port: http}
  initialDelaySeconds: {{ $p.initialDelaySeconds }}
  periodSeconds: {{ $p.periodSeconds }}
  timeoutSeconds: {{ $p.timeoutSeconds }}
  failureThreshold: {{ $p.failureThreshold }}
readinessProbe:
  httpGet: {path: /readyz, port: http}
  initialDelaySeconds: {{ $p.initialDelaySeconds }}
  periodSeconds: {{ $p.periodSeconds }}
  timeoutSeconds: {{ $p.timeoutSeconds }}
  failureThreshold: {{ $p.failureThreshold }}
{{- end -}}

{{- define "evalstream.podAnnotations" -}}
{{- if .root.Values.metrics.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ include "evalstream.port" .component | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end -}}

{{/* Non-root, no capabilities: what the images expect (user 10001). */}}
{{- define "evalstream.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
{{- end -}}

{{- define "evalstream.containerSecurityContext" -}}
allowPrivilegeEscalation: false
capabilities: {drop: [ALL]}
{{- end -}}

{{/* The work topic and consumer group of a worker group, as topics.py names them. */}}
{{- define "evalstream.workTopic" -}}
{{- printf "%seval.work.%s" .root.Values.kafka.topicPrefix .group -}}
{{- end -}}

{{- define "evalstream.workerConsumerGroup" -}}
{{- printf "%sevalstream-worker-%s" .root.Values.kafka.topicPrefix .group -}}
{{- end -}}

{{/* The SASL mechanism as KEDA's Kafka scaler names it. */}}
{{- define "evalstream.kedaSasl" -}}
{{- get (dict "SCRAM-SHA-512" "scram_sha512" "SCRAM-SHA-256" "scram_sha256" "PLAIN" "plaintext") .Values.kafka.sasl.mechanism -}}
{{- end -}}
