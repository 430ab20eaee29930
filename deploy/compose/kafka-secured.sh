#!/usr/bin/env bash
# Kafka 3.9.1 of docker-compose.yml's `secured` profile: one KRaft node whose only network listener is SASL_SSL
# (SCRAM-SHA-512) on :9093. The controller and a broker-local PLAINTEXT listener (the health check's) are bound to
# 127.0.0.1 inside the container. KRaft's StandardAuthorizer denies whatever no ACL allows; one SCRAM user per
# service (ptel-worker, ptel-gateway, ptel-monitor) and the administrator ptel-admin (a super user: the one-shot
# `kafka-setup` service creates the topics and applies each service's ACLs with `ptel topics create` and
# `ptel acls apply`, from the one table ptel/principal_roles.py) are added when the storage is formatted (first
# start), each with the password deploy/compose/make_secrets.py generated (scram-<user> in this broker's own secrets
# volume); the broker's key is a PKCS#12 keystore, the CA a PEM truststore (KIP-651).
set -euo pipefail

secrets=/run/secrets/ptel
props=/tmp/server.properties
data=/var/lib/kafka/data

cat > "$props" <<EOF
node.id=1
process.roles=broker,controller
listeners=SASL_SSL://:9093,INTERNAL://127.0.0.1:9090,CONTROLLER://127.0.0.1:9091
advertised.listeners=SASL_SSL://kafka-secured:9093,INTERNAL://127.0.0.1:9090
listener.security.protocol.map=SASL_SSL:SASL_SSL,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT
controller.listener.names=CONTROLLER
inter.broker.listener.name=INTERNAL
controller.quorum.voters=1@127.0.0.1:9091
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
ssl.keystore.type=PKCS12
ssl.keystore.location=$secrets/broker-keystore.p12
ssl.keystore.password=$(cat "$secrets/broker-key-password")
ssl.key.password=$(cat "$secrets/broker-key-password")
ssl.truststore.type=PEM
ssl.truststore.location=$secrets/ca.pem
log.dirs=$data
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
default.replication.factor=1
min.insync.replicas=1
group.initial.rebalance.delay.ms=0
num.partitions=1
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:ptel-admin;User:ANONYMOUS
EOF
chmod 600 "$props"

# User:ANONYMOUS is the principal of the loopback-only PLAINTEXT and controller listeners (this container only)
scram=()
for file in "$secrets"/scram-*; do
    scram+=(--add-scram "SCRAM-SHA-512=[name=${file##*/scram-},password=$(cat "$file")]")
done
/opt/kafka/bin/kafka-storage.sh format --ignore-formatted -t "$CLUSTER_ID" -c "$props" "${scram[@]}"
exec /opt/kafka/bin/kafka-server-start.sh "$props"
