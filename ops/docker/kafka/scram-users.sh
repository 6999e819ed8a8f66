#!/usr/bin/env bash
# The kafka service's command (docker-compose.yml): starts the image's own launcher, then
# gives every principal of libs/common acls.py its SCRAM-SHA-512 credential, as the admin over
# SASL/PLAIN (the admin's PLAIN password is static broker config, so it works before any
# SCRAM credential exists; KRaft can only take SCRAM credentials from a running cluster or at
# format time). Idempotent: a restart sets the same passwords again. The healthcheck waits
# for /tmp/scram-users-ready, so bootstrap and the services start once the users exist.
set -euo pipefail
rm -f /tmp/scram-users-ready
/etc/kafka/docker/run &
broker=$!
config=/tmp/admin.properties
(
  umask 077
  cat >"$config" <<PROPS
security.protocol=SASL_PLAINTEXT
sasl.mechanism=PLAIN
sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="${KAFKA_ADMIN_PASSWORD}";
PROPS
)
until /opt/kafka/bin/kafka-broker-api-versions.sh --bootstrap-server localhost:19092 --command-config "$config" >/dev/null 2>&1; do
  kill -0 "$broker" 2>/dev/null || exit 1
  sleep 2
done
for principal in admin producer router worker aggregator user; do
  var="KAFKA_${principal^^}_PASSWORD"
  # (--add-config-file would keep the password off the command line, but Kafka 4.4 mangles
  # the SCRAM key read from a file; inside this container only the kafka user sees it)
  /opt/kafka/bin/kafka-configs.sh --bootstrap-server localhost:19092 --command-config "$config" \
    --alter --entity-type users --entity-name "$principal" \
    --add-config "SCRAM-SHA-512=[password=${!var:?$var is not set}]" >/dev/null
done
touch /tmp/scram-users-ready
wait "$broker"
