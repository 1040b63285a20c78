"""The keys of a job, derived from its one secret (``P2PLEARN_JOB_KEY``).

The control plane (HMAC-SHA256 over every frame) and the data plane (AES-256-GMAC tags on every
datagram) never use the secret itself: each gets its own key from HKDF-SHA256 (RFC 5869) with a
label of its own, so a key recovered from one plane says nothing about the other. The data key
also mixes in the full job id: two jobs that share a secret (one ``P2PLEARN_JOB_KEY`` for a user's
Slurm jobs, say) refuse each other's datagrams.
"""

from __future__ import annotations

import hashlib
import hmac

CONTROL_LABEL = b"p2plearn control v1"
DATA_LABEL = b"p2plearn data v3"
_SALT = b"p2plearn job key"


def material(secret: str | bytes) -> bytes:
    """The secret's bytes: hex when it is hex (as the launchers make it), else the text itself."""
    if isinstance(secret, bytes):
        return secret
    try:
        return bytes.fromhex(secret)
    except ValueError:
        return secret.encode()


def hkdf(secret: str | bytes, label: bytes, size: int, salt: bytes = _SALT) -> bytes:
    """HKDF-SHA256: extract with ``salt``, expand with ``label`` (RFC 5869's info) to ``size`` bytes."""
    prk = hmac.new(salt, material(secret), hashlib.sha256).digest()
    out, block, counter = b"", b"", 1
    while len(out) < size:
        block = hmac.new(prk, block + label + bytes([counter]), hashlib.sha256).digest()
        out, counter = out + block, counter + 1
    return out[:size]


def control_key(secret: str | bytes) -> bytes:
    """The 256-bit HMAC key of control-plane frames."""
    return hkdf(secret, CONTROL_LABEL, 32)


def data_key(secret: str | bytes, job_id: str) -> bytes:
    """The 256-bit AES-GMAC key of one job's datagrams (give `Channel` the same ``job_id``)."""
    return hkdf(secret, DATA_LABEL + b"\0" + job_id.encode(), 32)


def job_tag(job_id: str) -> int:
    """The 32-bit job field of every datagram: from a hash of the whole job id (not its first
    bytes, which jobs 1234567 and 1234599 share), so that jobs without tags stay apart too."""
    return int.from_bytes(hashlib.sha256(job_id.encode()).digest()[:4], "little")
