"""A real secured Kafka 3.9.1 for the tests: SASL_SSL with SCRAM-SHA-512 users and an SSL listener that requires a
client certificate (mutual TLS), beside a PLAINTEXT listener the tests use to look inside.

Everything secret is made at test time in a temporary folder, nothing is committed: a self-signed CA and the
broker's PKCS#12 keystore and truststore with ``keytool`` (the JDK's), the client's certificate signed by that CA
with ``cryptography``, and the SCRAM user with Kafka's own ``StorageTool format --add-scram``.
"""

from __future__ import annotations

import datetime
import secrets
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID

from ptel.kafka_broker import LocalKafka, free_port

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


def _keytool(*args: str) -> None:
    done = subprocess.run(["keytool", *args], capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise RuntimeError(f"keytool {' '.join(args[:2])} failed: {done.stdout}{done.stderr}")


def make_pki(folder: Path, cn: str = "ptel-test-ca") -> Pki:
    """A CA, the broker's keystore (certificate for 127.0.0.1 / localhost signed by the CA), a truststore of the CA,
    and a client certificate and key (PEM) signed by the CA."""
    folder.mkdir(parents=True, exist_ok=True)
    pw = secrets.token_hex(12)
    ca, broker, trust = folder / "ca.p12", folder / "broker.p12", folder / "trust.p12"
    ca_pem, csr, signed = folder / "ca.pem", folder / "broker.csr", folder / "broker.pem"
    common = ["-storetype", "PKCS12", "-storepass", pw, "-keypass", pw]
    _keytool("-genkeypair", "-alias", "ca", "-keyalg", "EC", "-groupname", "secp256r1", "-dname", f"CN={cn}",
             "-ext", "bc:c", "-validity", "2", "-keystore", str(ca), *common)  # fmt: skip
    _keytool("-exportcert", "-rfc", "-alias", "ca", "-keystore", str(ca), "-storepass", pw, "-file", str(ca_pem))
    _keytool("-genkeypair", "-alias", "broker", "-keyalg", "EC", "-groupname", "secp256r1", "-dname", "CN=localhost",
             "-validity", "2", "-keystore", str(broker), *common)  # fmt: skip
    _keytool("-certreq", "-alias", "broker", "-keystore", str(broker), "-storepass", pw, "-file", str(csr))
    _keytool("-gencert", "-alias", "ca", "-keystore", str(ca), "-storepass", pw, "-infile", str(csr), "-outfile",
             str(signed), "-rfc", "-validity", "2", "-ext", "SAN=IP:127.0.0.1,DNS:localhost")  # fmt: skip
    _keytool("-importcert", "-noprompt", "-alias", "ca", "-file", str(ca_pem), "-keystore", str(broker), *common)
    _keytool("-importcert", "-noprompt", "-alias", "broker", "-file", str(signed), "-keystore", str(broker), *common)
    _keytool("-importcert", "-noprompt", "-alias", "ca", "-file", str(ca_pem), "-keystore", str(trust), *common)
    # the client's certificate, signed by the CA's key (read back from its keystore)
    ca_key, ca_cert, _ = pkcs12.load_key_and_certificates(ca.read_bytes(), pw.encode())
    if ca_key is None or ca_cert is None:
        raise RuntimeError("the CA keystore holds no key")
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ptel-test-client")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    client_cert, client_key = folder / "client.pem", folder / "client.key"
    client_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    client_key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    client_key.chmod(0o600)
    return Pki(ca_pem, broker, trust, client_cert, client_key, pw)


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
        "ssl.truststore.type": "PKCS12",
        "ssl.truststore.location": str(pki.truststore),
        "ssl.truststore.password": pki.store_password,
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
