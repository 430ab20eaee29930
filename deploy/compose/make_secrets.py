"""Credentials of docker-compose.yml's ``secured`` profile, generated at its first start (nothing secret is committed).

``python make_secrets.py DIR [--kafka-host HOST]`` writes into ``DIR`` (the ``ptel-secrets`` volume), once -- a
second run finds ``DIR/.complete`` and changes nothing:

====================================  =====  =======================================================================
file                                  owner  what
====================================  =====  =======================================================================
``ca.pem``                            root   a fresh CA (its key is never written): trusted by the clients and Kafka
``broker-keystore.p12``               kafka  the broker's key and certificate for ``HOST`` (PKCS#12, encrypted)
``broker-key-password``               kafka  that keystore's password
``kafka-password``                    kafka  the SCRAM-SHA-512 password of user ``ptel`` (Kafka formats it in)
``kafka-client.yaml``                 ptel   the clients' ``--kafka-config``: SASL_SSL, SCRAM-SHA-512, that password
``monitor-operator-token``            ptel   the monitor's operator bearer token
``worker-operator-token``             ptel   the bearer token of the worker's ``/metrics`` (``--operator-token-file``)
``gateway-operator-token``            ptel   the bearer token of the gateway's operator listener (``/metrics``)
``ledger.key``                        ptel   the workers' privacy-ledger key (``PTEL_LEDGER_KEY_FILE``): one file for
                                             every worker of the group (``agents/stage2/ledger_seal.py``)
``gateway.keys``                      ptel   the gateway's key file (``ptel gateway-keys``)
``gateway.pem``, ``gateway.key``      ptel   the gateway's HTTPS certificate (``localhost``, ``gateway-secured``)
====================================  =====  =======================================================================

Each secret is mode 0600 and owned by the one user that reads it (Kafka's image runs as uid 1000, ours as 10001),
so a service sees only its own secrets' contents. Runs in the project image (it has ``cryptography``). A folder made
by an older version gets the files it lacks (:data:`ADDED_LATER`) and keeps the others.
"""

from __future__ import annotations

import argparse
import datetime
import os
import secrets
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID

KAFKA_UID = 1000  # apache/kafka image's appuser
PTEL_UID = 10001  # the project image's ptel user (Dockerfile)
USER = "ptel"
VALIDITY = datetime.timedelta(days=365)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _issue(
    ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate, key: ec.EllipticCurvePrivateKey, hosts: list[str]
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in hosts]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )


def _write(path: Path, data: bytes, uid: int, mode: int = 0o600) -> None:
    path.write_bytes(data)
    path.chmod(mode)
    if os.geteuid() == 0:
        os.chown(path, uid, uid)


#: Where the services mount the secrets volume (docker-compose.yml): the client file's CA path is there.
MOUNT = Path("/run/secrets/ptel")


def make_secrets(folder: Path, kafka_host: str, mount: Path = MOUNT) -> bool:
    """Write the files of the module docstring into ``folder`` (seen by the services at ``mount``); False (and nothing
    written) if already done."""
    if (folder / ".complete").exists():
        return _add_missing(folder)
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("ptel-compose-ca"))
        .issuer_name(_name("ptel-compose-ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    ca_pem = ca.public_bytes(pem)
    _write(folder / "ca.pem", ca_pem, 0, 0o644)

    broker_key = ec.generate_private_key(ec.SECP256R1())
    broker = _issue(ca_key, ca, broker_key, [kafka_host, "localhost"])
    key_password = secrets.token_urlsafe(24)
    # PKCS#12 (AES-256, PBKDF2-HMAC-SHA256): a PEM keystore's encrypted PKCS#8 key would need a PBES2
    # SecretKeyFactory, which the JDK lacks ("PBES2 SecretKeyFactory not available")
    keystore = pkcs12.serialize_key_and_certificates(
        b"broker", broker_key, broker, [ca], serialization.BestAvailableEncryption(key_password.encode())
    )
    _write(folder / "broker-keystore.p12", keystore, KAFKA_UID)
    _write(folder / "broker-key-password", key_password.encode(), KAFKA_UID)

    password = secrets.token_urlsafe(24)
    _write(folder / "kafka-password", password.encode(), KAFKA_UID)
    client = {
        "kafka": {
            "bootstrap_servers": f"{kafka_host}:9093",
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_username": USER,
            "sasl_password": password,
            "ssl_cafile": str(mount / "ca.pem"),
        }
    }
    _write(folder / "kafka-client.yaml", yaml.safe_dump(client, sort_keys=False).encode(), PTEL_UID)
    _write(folder / "monitor-operator-token", secrets.token_urlsafe(32).encode(), PTEL_UID)

    from gateway.keys import GatewayKeys  # the project image's own key format

    GatewayKeys.generate().save(folder / "gateway.keys")
    if os.geteuid() == 0:
        os.chown(folder / "gateway.keys", PTEL_UID, PTEL_UID)
    gateway_key = ec.generate_private_key(ec.SECP256R1())
    gateway = _issue(ca_key, ca, gateway_key, ["localhost", "gateway-secured"])
    _write(folder / "gateway.pem", gateway.public_bytes(pem) + ca_pem, PTEL_UID, 0o644)
    unencrypted = serialization.NoEncryption()
    _write(
        folder / "gateway.key",
        gateway_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, unencrypted),
        PTEL_UID,
    )
    _add_missing(folder)
    (folder / ".complete").write_text("made by deploy/compose/make_secrets.py\n")
    return True


#: Files a folder made before they existed lacks: written when absent, never replaced (a new ledger key would make
#: the workers refuse their own ledger as tampered).
ADDED_LATER = ("worker-operator-token", "gateway-operator-token", "ledger.key")


def _add_missing(folder: Path) -> bool:
    """Write those of :data:`ADDED_LATER` that ``folder`` lacks; whether any was written."""
    from agents.stage2.ledger_seal import LedgerSecret  # the project image's own key file format

    made = False
    for name in ADDED_LATER:
        path = folder / name
        if path.exists():
            continue
        if name == "ledger.key":
            LedgerSecret.from_file(path, create=True)  # mode 0600
            if os.geteuid() == 0:
                os.chown(path, PTEL_UID, PTEL_UID)
        else:
            _write(path, secrets.token_urlsafe(32).encode(), PTEL_UID)
        made = True
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--kafka-host", default="kafka-secured")
    args = parser.parse_args()
    made = make_secrets(args.folder, args.kafka_host)
    print(f"{'wrote' if made else 'kept'} the secured profile's secrets in {args.folder}")


if __name__ == "__main__":
    main()
