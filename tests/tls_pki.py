"""A test PKI for the TLS tests (tests/test_tls.py) and tools/tls_bench.py, made with the
``cryptography`` package: ECDSA P-256 keys, as rustdist's pinned keys are."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Optional, Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

Issuer = tuple[x509.Certificate, ec.EllipticCurvePrivateKey]


def _certificate(name: str, key: ec.EllipticCurvePrivateKey,
                 issuer: Optional[Issuer]) -> x509.Certificate:
    """`name`'s certificate for `key`, signed by `issuer` (a CA's certificate and key), or a
    self-signed CA's when `issuer` is None."""
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder()
               .subject_name(subject)
               .issuer_name(issuer[0].subject if issuer else subject)
               .public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(days=1))
               .not_valid_after(now + datetime.timedelta(days=30))
               .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
               .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None),
                              critical=True))
    return builder.sign(issuer[1] if issuer else key, hashes.SHA256())


def _write_leaf(folder: Path, file: str, name: str, issuer: Issuer) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _certificate(name, key, issuer)
    (folder / f"{file}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / f"{file}.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))


def _new_ca(name: str) -> Issuer:
    key = ec.generate_private_key(ec.SECP256R1())
    return _certificate(name, key, None), key


def write_test_pki(folder: Path, names: Sequence[str]) -> None:
    """Writes into `folder`: ``ca.pem``, and for each of `names` ``NAME.pem`` and ``NAME.key``
    signed by that CA; ``rogue-ca.pem`` with ``rogue.pem``/``rogue.key`` signed by another CA
    (a host the job's CA never vouched for)."""
    folder.mkdir(parents=True, exist_ok=True)
    good = _new_ca("rustdist test CA")
    (folder / "ca.pem").write_bytes(good[0].public_bytes(serialization.Encoding.PEM))
    for name in names:
        _write_leaf(folder, name, name, good)
    rogue = _new_ca("another CA")
    (folder / "rogue-ca.pem").write_bytes(rogue[0].public_bytes(serialization.Encoding.PEM))
    _write_leaf(folder, "rogue", "rogue", rogue)
