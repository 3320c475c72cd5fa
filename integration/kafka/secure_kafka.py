"""A secured Apache Kafka for the security tests: one KRaft node (``scripts/kafka_server.sh``) with, beside its
PLAINTEXT listener (inter-broker, controller and the tests' own admin), the listeners

- ``SASL_PLAINTEXT`` with SASL/PLAIN (users in the listener's JAAS config) and SCRAM-SHA-512 (credentials
  added after start over the PLAINTEXT listener with an AdminClient: no authorizer runs);
- ``SSL``: a CA and a broker certificate (SAN ``127.0.0.1`` / ``localhost``) made here with ``cryptography``,
  given to the broker as PEM (``ssl.keystore.type=PEM``);
- ``SASL_SSL``: both of the above;
- ``MTLS`` (an SSL listener with ``ssl.client.auth=required``): mutual TLS, the client's certificate signed by the CA.

Every client-side file (the CA certificate) is in :attr:`SecureKafka.ca_file`."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import ipaddress
import os
import pathlib
import socket
import subprocess
import tempfile
import time
from typing import Iterator

from integration.kafka.apache_kafka import SCRIPT

#: SASL users of the broker (user -> password); the passwords are what the tests look for in error texts
USERS = {"alice": "alice-pw-7f3c9e", "bob": "bob-pw-51d2aa"}
PLAIN_JAAS = "org.apache.kafka.common.security.plain.PlainLoginModule required"
SCRAM_JAAS = "org.apache.kafka.common.security.scram.ScramLoginModule required"


@dataclasses.dataclass(frozen=True)
class SecureKafka:
    plaintext: str       #: bootstrap of the unauthenticated listener (topic set-up, checks)
    sasl_plaintext: str
    ssl: str
    sasl_ssl: str
    mtls: str            #: SSL listener that requires a client certificate (ssl.client.auth=required)
    ca_file: str         #: PEM of the CA that signed the broker's certificate
    client_pem: str      #: the client's key and certificate chain (one PEM file, signed by the CA)


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def make_ca_and_broker_cert(where: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path, pathlib.Path]:
    """``(ca.pem, broker-key.pem, broker-chain.pem)``: a CA and a broker certificate for 127.0.0.1 / localhost,
    the key unencrypted PKCS#8 (what Kafka's PEM key store reads); also ``client.pem``, a client key and
    certificate chain signed by the CA (for the mutual-TLS listener)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("twophase test CA")).issuer_name(name("twophase test CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(name("localhost")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = (x509.CertificateBuilder().subject_name(name("twophase-client")).issuer_name(ca.subject)
              .public_key(client_key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
              .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
              .sign(ca_key, hashes.SHA256()))
    (where / "client.pem").write_bytes(  # what Kafka's ssl.keystore.type=PEM file holds: the key, then the chain
        client_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        + client.public_bytes(pem) + ca.public_bytes(pem))
    ca_file, key_file, chain_file = where / "ca.pem", where / "broker-key.pem", where / "broker-chain.pem"
    ca_file.write_bytes(ca.public_bytes(pem))
    key_file.write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    chain_file.write_bytes(cert.public_bytes(pem) + ca.public_bytes(pem))
    return ca_file, key_file, chain_file


def _add_scram_users(bootstrap: str) -> None:
    """SCRAM-SHA-512 credentials of :data:`USERS` (over the PLAINTEXT listener; KRaft stores them)."""
    from confluent_kafka.admin import (AdminClient, ScramCredentialInfo, ScramMechanism,
                                       UserScramCredentialUpsertion)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    ups = [UserScramCredentialUpsertion(u, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), p.encode())
           for u, p in USERS.items()]
    for f in admin.alter_user_scram_credentials(ups).values():
        f.result(timeout=60)
    deadline = time.time() + 30            # the credentials reach the broker's metadata cache asynchronously
    while time.time() < deadline:
        desc = admin.describe_user_scram_credentials(list(USERS))
        try:
            if all(f.result(timeout=10).scram_credential_infos for f in desc.values()):
                return
        except Exception:
            pass
        time.sleep(0.3)
    raise RuntimeError("SCRAM credentials never showed up on the broker")


@contextlib.contextmanager
def secure_kafka_broker(*settings: str) -> Iterator[SecureKafka]:
    """A fresh Apache Kafka with PLAINTEXT, SASL_PLAINTEXT, SSL and SASL_SSL listeners (see the module doc)."""
    with tempfile.TemporaryDirectory(prefix="twophase-secure-kafka-") as d:
        where = pathlib.Path(d)
        ca_file, key_file, chain_file = make_ca_and_broker_cert(where)
        plain, sasl, ssl_, sasl_ssl, mtls = (_free_port() for _ in range(5))
        extra = (f"SASL_PLAINTEXT://127.0.0.1:{sasl},SSL://127.0.0.1:{ssl_},SASL_SSL://127.0.0.1:{sasl_ssl},"
                 f"MTLS://127.0.0.1:{mtls}")
        users = " ".join(f'user_{u}="{p}"' for u, p in USERS.items())
        props = [
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{plain},{extra}",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,"
            "SASL_PLAINTEXT:SASL_PLAINTEXT,SSL:SSL,SASL_SSL:SASL_SSL,MTLS:SSL",
            "listener.name.mtls.ssl.client.auth=required",
            "sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-512",
            "ssl.keystore.type=PEM",
            f"ssl.keystore.location={key_file}.keystore",
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={ca_file}",
            "ssl.client.auth=none",
        ]
        # a PEM key store file: the private key, then the certificate chain
        pathlib.Path(f"{key_file}.keystore").write_bytes(key_file.read_bytes() + chain_file.read_bytes())
        for listener in ("sasl_plaintext", "sasl_ssl"):
            props += [f"listener.name.{listener}.plain.sasl.jaas.config={PLAIN_JAAS} {users};",
                      f"listener.name.{listener}.scram-sha-512.sasl.jaas.config={SCRAM_JAAS};"]
        env = {**os.environ, "KAFKA_EXTRA_LISTENERS": extra}
        res = subprocess.run(["bash", str(SCRIPT), "start", d, str(plain), *props, *settings], capture_output=True,
                             text=True, timeout=600, env=env)
        try:
            if res.returncode != 0:
                raise RuntimeError(f"scripts/kafka_server.sh start failed: {res.stderr[-2000:]}")
            bootstrap = res.stdout.strip().splitlines()[-1]
            _add_scram_users(bootstrap)
            yield SecureKafka(plaintext=bootstrap, sasl_plaintext=f"127.0.0.1:{sasl}", ssl=f"127.0.0.1:{ssl_}",
                              sasl_ssl=f"127.0.0.1:{sasl_ssl}", mtls=f"127.0.0.1:{mtls}", ca_file=str(ca_file),
                              client_pem=str(where / "client.pem"))
        finally:
            subprocess.run(["bash", str(SCRIPT), "stop", d], capture_output=True, timeout=60, env=env)
