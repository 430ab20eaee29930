"""A real secured Kafka 3.9.1 for the tests: SASL_SSL with SCRAM-SHA-512 users and an SSL listener that requires a
client certificate (mutual TLS), beside a PLAINTEXT listener the tests use to look inside.

Everything secret is made at test time in a temporary folder, nothing is committed: a self-signed CA, the broker's
PKCS#12 keystore, a PEM truststore and the client's certificate signed by that CA, all with ``cryptography`` (in
process: no ``keytool`` JVMs), and the SCRAM user with Kafka's own ``StorageTool format --add-scram``.
"""

from __future__ import annotations

import datetime
import ipaddress
import secrets
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID

from ptel.kafka_broker import LocalKafka
from ptel.local_process import free_port

USER = "ptel-test"


@dataclass
class Pki:
    """Files of one test PKI."""

    ca_pem: Path
    broker_keystore: Path
    truststore: Path
    client_cert: Path
    client_key: Path
    store_password: str


@dataclass
class SecuredBroker:
    """A running broker with its three client listeners and the credentials to use them."""

    kafka: LocalKafka
    plaintext: str
    sasl_ssl: str
    mtls: str
    pki: Pki
    password: str

    def stop(self) -> None:
        self.kafka.stop()
        shutil.rmtree(self.kafka.instance_dir, ignore_errors=True)


def _certificate(subject: str, key: ec.EllipticCurvePrivateKey, ca: x509.Certificate | None) -> x509.CertificateBuilder:
    """A certificate of ``key`` for ``subject``, issued by ``ca`` (self-issued when ``None``), valid for two days."""
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name if ca is None else ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if ca is None:
        return builder
    aki = x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(
        ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    )
    return builder.add_extension(aki, critical=False)


def make_pki(folder: Path, cn: str = "ptel-test-ca") -> Pki:
    """A CA, the broker's keystore (certificate for 127.0.0.1 / localhost signed by the CA), a truststore of the CA,
    and a client certificate and key (PEM) signed by the CA.

    All made in process with ``cryptography`` (EC P-256, ECDSA-SHA256): the broker's keystore is PKCS#12 (3DES and
    SHA-1 MAC, readable by every JDK), the truststore the CA's certificate in PEM (``ssl.truststore.type=PEM``,
    Kafka's KIP-651). No ``keytool``: eight JVM starts per PKI cost seconds each on a loaded machine."""
    folder.mkdir(parents=True, exist_ok=True)
    pw = secrets.token_hex(12)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        _certificate(cn, ca_key, None)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    ca_pem = folder / "ca.pem"
    ca_pem.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    broker_key = ec.generate_private_key(ec.SECP256R1())
    san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.IPv4Address("127.0.0.1")), x509.DNSName("localhost")])
    broker_cert = (
        _certificate("localhost", broker_key, ca_cert).add_extension(san, critical=False).sign(ca_key, hashes.SHA256())
    )
    encryption = (
        serialization.PrivateFormat.PKCS12.encryption_builder()
        .kdf_rounds(2048)
        .key_cert_algorithm(pkcs12.PBES.PBESv1SHA1And3KeyTripleDESCBC)
        .hmac_hash(hashes.SHA1())
        .build(pw.encode())
    )
    broker = folder / "broker.p12"
    broker.write_bytes(pkcs12.serialize_key_and_certificates(b"broker", broker_key, broker_cert, [ca_cert], encryption))
    client_key_obj = ec.generate_private_key(ec.SECP256R1())
    client = _certificate("ptel-test-client", client_key_obj, ca_cert).sign(ca_key, hashes.SHA256())
    client_cert, client_key = folder / "client.pem", folder / "client.key"
    client_cert.write_bytes(client.public_bytes(serialization.Encoding.PEM))
    client_key.write_bytes(
        client_key_obj.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    client_key.chmod(0o600)
    return Pki(ca_pem, broker, ca_pem, client_cert, client_key, pw)


def start_secured_broker(folder: Path) -> SecuredBroker:
    """Start a broker on free loopback ports with PLAINTEXT, SASL_SSL (SCRAM-SHA-512) and SSL (client certificates
    required) listeners (blocking: call it with ``asyncio.to_thread`` from async code)."""
    pki = make_pki(folder / "pki")
    password = secrets.token_hex(12)
    port, sasl, mtls, controller = free_port(), free_port(), free_port(), free_port()
    listeners = (
        f"PLAINTEXT://127.0.0.1:{port},SASL_SSL://127.0.0.1:{sasl},SSL://127.0.0.1:{mtls},"
        f"CONTROLLER://127.0.0.1:{controller}"
    )
    overrides = {
        "listeners": listeners,
        "advertised.listeners": listeners,
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,SSL:SSL,CONTROLLER:PLAINTEXT",
        "sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        ),
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(pki.broker_keystore),
        "ssl.keystore.password": pki.store_password,
        "ssl.key.password": pki.store_password,
        "ssl.truststore.type": "PEM",  # certificates only, no password (KIP-651)
        "ssl.truststore.location": str(pki.truststore),
        "listener.name.ssl.ssl.client.auth": "required",
    }
    kafka = LocalKafka(
        port=port,
        controller_port=controller,
        overrides=overrides,
        format_args=("--add-scram", f"SCRAM-SHA-512=[name={USER},password={password}]"),
    )
    kafka.start()
    return SecuredBroker(kafka, f"127.0.0.1:{port}", f"127.0.0.1:{sasl}", f"127.0.0.1:{mtls}", pki, password)


@dataclass
class AuthorizingBroker:
    """A running broker whose ``StandardAuthorizer`` denies what no ACL allows: ``sasl`` (SASL_PLAINTEXT, SCRAM-SHA-512
    users) for the principals under test, ``plaintext`` for the super user (``User:ANONYMOUS``) that sets up topics
    and ACLs."""

    kafka: LocalKafka
    plaintext: str
    sasl: str
    password: str

    def stop(self) -> None:
        self.kafka.stop()
        shutil.rmtree(self.kafka.instance_dir, ignore_errors=True)


def start_authorizing_broker(users: Sequence[str]) -> AuthorizingBroker:
    """Start a broker with KRaft's ``StandardAuthorizer`` (``allow.everyone.if.no.acl.found=false``) and a
    SASL_PLAINTEXT listener for the SCRAM-SHA-512 ``users`` (one password); no TLS (the authorizer is what is under
    test, and no key stores need making) (blocking: call it with ``asyncio.to_thread``)."""
    password = secrets.token_hex(12)
    port, sasl, controller = free_port(), free_port(), free_port()
    listeners = f"PLAINTEXT://127.0.0.1:{port},SASL_PLAINTEXT://127.0.0.1:{sasl},CONTROLLER://127.0.0.1:{controller}"
    overrides = {
        "listeners": listeners,
        "advertised.listeners": listeners,
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT",
        "sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        ),
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "false",
        "super.users": "User:ANONYMOUS",  # the PLAINTEXT listener's and the controller's principal
    }
    scram = [a for user in users for a in ("--add-scram", f"SCRAM-SHA-512=[name={user},password={password}]")]
    kafka = LocalKafka(port=port, controller_port=controller, overrides=overrides, format_args=tuple(scram))
    kafka.start()
    return AuthorizingBroker(kafka, f"127.0.0.1:{port}", f"127.0.0.1:{sasl}", password)
