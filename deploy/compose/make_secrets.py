"""Credentials of docker-compose.yml's ``secured`` profile, generated at its first start (nothing secret is committed).

``python make_secrets.py DIR [--kafka-host HOST]`` writes one folder per service into ``DIR`` -- each a volume of
its own in docker-compose.yml, mounted into that service only -- once: a second run finds ``DIR/.complete`` and
changes nothing. Which files each service's folder holds is its row of the one table,
:data:`ptel.principal_roles.ROLES` (``Role.secrets``), and nothing more:

==============  =====  ===========================================================================================
folder          owner  files
==============  =====  ===========================================================================================
``kafka/``      kafka  ``ca.pem``, ``broker-keystore.p12`` and ``broker-key-password`` (the broker's key for
                       ``HOST``), ``scram-<user>``: the SCRAM-SHA-512 password of each user (Kafka formats them in)
``admin/``      ptel   ``kafka.yaml`` (user ``ptel-admin``, a super user: ``ptel topics create``, ``ptel acls
                       apply`` at start), ``ca.pem``
``worker/``     ptel   ``kafka.yaml`` (user ``ptel-worker``), ``ca.pem``, ``operator-token``, ``ledger.key`` (the
                       workers' privacy-ledger key, one file for every worker of the group)
``gateway/``    ptel   ``kafka.yaml`` (user ``ptel-gateway``), ``ca.pem``, ``operator-token``, ``gateway.keys``,
                       ``gateway.pem`` and ``gateway.key`` (its HTTPS certificate) -- never the ledger key
``monitor/``    ptel   ``kafka.yaml`` (user ``ptel-monitor``), ``ca.pem``, ``operator-token``
==============  =====  ===========================================================================================

``ca.pem`` is a fresh CA (its key is never written). Each secret is mode 0600 and owned by the one user that reads
it (Kafka's image runs as uid 1000, ours as 10001). Runs in the project image (it has ``cryptography`` and ``ptel``).
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

from ptel.principal_roles import ADMIN, ROLES, Role

KAFKA_UID = 1000  # apache/kafka image's appuser
PTEL_UID = 10001  # the project image's ptel user (Dockerfile)
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


#: Where each service mounts its own secrets volume (docker-compose.yml): the client file's CA path is there.
MOUNT = Path("/run/secrets/ptel")
#: The services of the secured profile (their roles' rows say which files their folder gets), and the admin.
SERVICES = ("admin", "worker", "gateway", "monitor")


def _client(role: Role, kafka_host: str, password: str, mount: Path) -> bytes:
    """The ``--kafka-config`` of ``role``'s own SCRAM user."""
    client = {
        "kafka": {
            "bootstrap_servers": f"{kafka_host}:9093",
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_username": scram_user(role),
            "sasl_password": password,
            "ssl_cafile": str(mount / "ca.pem"),
        }
    }
    return yaml.safe_dump(client, sort_keys=False).encode()


def scram_user(role: Role) -> str:
    """The SCRAM user of ``role``'s principal (``User:ptel-worker`` -> ``ptel-worker``)."""
    return role.principal.split(":", 1)[1]


def make_secrets(folder: Path, kafka_host: str, mount: Path = MOUNT) -> bool:
    """Write the folders of the module docstring into ``folder`` (each seen by its service at ``mount``); False (and
    nothing written) if already done."""
    if (folder / ".complete").exists():
        return False
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
    kafka = folder / "kafka"
    kafka.mkdir(parents=True, exist_ok=True)
    _write(kafka / "ca.pem", ca_pem, 0, 0o644)
    broker_key = ec.generate_private_key(ec.SECP256R1())
    broker = _issue(ca_key, ca, broker_key, [kafka_host, "localhost"])
    key_password = secrets.token_urlsafe(24)
    # PKCS#12 (AES-256, PBKDF2-HMAC-SHA256): a PEM keystore's encrypted PKCS#8 key would need a PBES2
    # SecretKeyFactory, which the JDK lacks ("PBES2 SecretKeyFactory not available")
    keystore = pkcs12.serialize_key_and_certificates(
        b"broker", broker_key, broker, [ca], serialization.BestAvailableEncryption(key_password.encode())
    )
    _write(kafka / "broker-keystore.p12", keystore, KAFKA_UID)
    _write(kafka / "broker-key-password", key_password.encode(), KAFKA_UID)

    from agents.stage2.ledger_seal import LedgerSecret  # the project image's own key formats
    from gateway.keys import GatewayKeys

    for service in SERVICES:
        role = ROLES.get(service, ADMIN)
        out = folder / service
        out.mkdir(parents=True, exist_ok=True)
        password = secrets.token_urlsafe(24)
        _write(kafka / f"scram-{scram_user(role)}", password.encode(), KAFKA_UID)
        for name in role.secrets:
            path = out / name
            if name == "kafka.yaml":
                _write(path, _client(role, kafka_host, password, mount), PTEL_UID)
            elif name == "ca.pem":
                _write(path, ca_pem, PTEL_UID, 0o644)
            elif name == "operator-token":
                _write(path, secrets.token_urlsafe(32).encode(), PTEL_UID)
            elif name == "ledger.key":
                LedgerSecret.from_file(path, create=True)  # mode 0600
            elif name == "gateway.keys":
                GatewayKeys.generate().save(path)
            elif name == "gateway.pem":
                gateway_key = ec.generate_private_key(ec.SECP256R1())
                gateway = _issue(ca_key, ca, gateway_key, ["localhost", "gateway-secured"])
                _write(path, gateway.public_bytes(pem) + ca_pem, PTEL_UID, 0o644)
                key = gateway_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
                _write(out / "gateway.key", key, PTEL_UID)
            elif name != "gateway.key":  # written with gateway.pem
                raise ValueError(f"make_secrets.py does not know how to make {name!r} (role {role.name})")
            if os.geteuid() == 0 and path.exists():
                os.chown(path, PTEL_UID, PTEL_UID)
    (folder / ".complete").write_text("made by deploy/compose/make_secrets.py\n")
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--kafka-host", default="kafka-secured")
    args = parser.parse_args()
    made = make_secrets(args.folder, args.kafka_host)
    print(f"{'wrote' if made else 'kept'} the secured profile's secrets in {args.folder}")


if __name__ == "__main__":
    main()
