"""Certificates made at test time (no key in the repository, none to expire): a CA and the
server and client certificates it issues, written as PEM files for the bridge's and
Envoy's TLS settings."""

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _name(common_name):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write(directory, stem, cert, key):
    cert_path, key_path = Path(directory) / f"{stem}.crt", Path(directory) / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return str(cert_path), str(key_path)


def make_pki(directory):
    """A CA (`ca.crt`), a server certificate for localhost and 127.0.0.1 (`server.crt`,
    `server.key`) and a client certificate (`client.crt`, `client.key`) in `directory`:
    their paths by name."""
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=1)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name("testbed-ca")).issuer_name(_name("testbed-ca"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    paths = {"ca": str(Path(directory) / "ca.crt")}
    Path(paths["ca"]).write_bytes(ca.public_bytes(serialization.Encoding.PEM))

    def issue(stem, usage, names):
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (x509.CertificateBuilder().subject_name(_name(stem)).issuer_name(ca.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(start).not_valid_after(end)
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return _write(directory, stem, builder.sign(ca_key, hashes.SHA256()), key)

    paths["server_cert"], paths["server_key"] = issue(
        "server", ExtendedKeyUsageOID.SERVER_AUTH,
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    paths["client_cert"], paths["client_key"] = issue("client", ExtendedKeyUsageOID.CLIENT_AUTH, [])
    return paths
