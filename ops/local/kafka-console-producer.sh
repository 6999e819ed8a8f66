#!/usr/bin/env bash
# Apache Kafka's own console producer (what kafka-console-producer.sh runs in Kafka's
# distribution), for the local stack: the kafka-tools jars come from Maven Central on first
# use (ops/local/kafka/tools-pom.xml) and are cached beside the broker's.
#   ops/local/kafka-console-producer.sh --bootstrap-server 127.0.0.1:9092 --topic eval.jobs < job.json
# Every option is Kafka's (--help lists them); one message per input line.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
classpath="$("$root/.venv/bin/python" "$root/ops/local/stack.py" kafka-tools-classpath | tail -n 1)"
exec java -Xmx256m -cp "$classpath" org.apache.kafka.tools.ConsoleProducer "$@"
