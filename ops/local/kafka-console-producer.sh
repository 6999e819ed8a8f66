#!/usr/bin/env bash
# Apache Kafka's own console producer (what kafka-console-producer.sh runs in Kafka's
# distribution), for the local stack: the kafka-tools jars come from Maven Central on first
# use (ops/local/kafka/tools-pom.xml) and are cached beside the broker's.
#   eval "$(ops/local/stack.py env)"   # the users' Kafka principal (may publish jobs)
#   ops/local/kafka-console-producer.sh --bootstrap-server 127.0.0.1:9092 --topic eval.jobs < job.json
# Every option is Kafka's (--help lists them); one message per input line. The client's
# credentials come from KAFKA_SECURITY_PROTOCOL, KAFKA_SASL_MECHANISM, KAFKA_USERNAME and
# KAFKA_PASSWORD (libs/common kafka_security.py), through a client properties file readable
# by this user only and deleted on exit; pass --command-config yourself to use your own.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
py="$root/.venv/bin/python"
classpath="$("$py" "$root/ops/local/stack.py" kafka-tools-classpath | tail -n 1)"
config_args=()
case " $* " in
*" --command-config "* | *" --producer.config "*) ;;
*)
  props="$(umask 077 && mktemp)"
  trap 'rm -f "$props"' EXIT
  PYTHONPATH="$root/libs/common${PYTHONPATH:+:$PYTHONPATH}" "$py" -m evalstream.common.kafka_security properties >"$props"
  config_args=(--command-config "$props")
  ;;
esac
java -Xmx256m -cp "$classpath" org.apache.kafka.tools.ConsoleProducer "${config_args[@]}" "$@"
