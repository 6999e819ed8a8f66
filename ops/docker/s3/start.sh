#!/bin/sh
# The s3 service's entrypoint (docker-compose.yml): writes SeaweedFS's identity file from the
# template ops/s3/s3.compose.json (mounted at /etc/seaweedfs/s3.template.json) with each
# component's key pair and the bucket names from .env, readable by the seaweed user alone,
# then runs the image's own entrypoint with the service's command. The admin's key pair comes
# from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (SeaweedFS makes it an admin identity); the
# signing keys of the volume server and filer from WEED_JWT_* (security.toml's [jwt.*]).
set -eu
umask 077
out=/tmp/s3.json
tmp=$(mktemp)
cp /etc/seaweedfs/s3.template.json "$tmp"
for var in S3_PRODUCER_ACCESS_KEY S3_PRODUCER_SECRET_KEY S3_AGGREGATOR_ACCESS_KEY S3_AGGREGATOR_SECRET_KEY \
  S3_USER_ACCESS_KEY S3_USER_SECRET_KEY S3_BUCKET_DATASETS S3_BUCKET_RESULTS; do
  value=$(printenv "$var" || true)
  case "$value" in
    "" | *[!A-Za-z0-9._-]*)
      echo "s3: $var must be set to letters, digits, '.', '_' or '-' (.env)" >&2
      exit 1
      ;;
  esac
  sed -i "s|\${$var}|$value|g" "$tmp"
done
mv "$tmp" "$out"
chown seaweed:seaweed "$out" 2>/dev/null || true
exec /entrypoint.sh "$@"
