"""The persistent libp2p identity of a :class:`swarm.host.SwarmHost`: an Ed25519 key kept in
the host's data directory, so the same directory always gives the same peer id."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import Any

from libp2p.crypto.keys import PrivateKey

__all__ = ["IDENTITY_FILE", "IDENTITY_FILE_MODE", "PrivateKey", "load_or_create_identity"]

# Records keep the logger name of :mod:`swarm.host`, whose part of the host this is.
log = logging.getLogger("swarm.host")

#: File (inside ``data_dir``) holding the libp2p-protobuf-serialised Ed25519 private key.
IDENTITY_FILE = "identity.key"
IDENTITY_FILE_MODE = 0o600


def load_or_create_identity(data_dir: str | os.PathLike[str]) -> Any:
    """The host's Ed25519 ``KeyPair``: read from ``data_dir/identity.key`` or created there
    (mode 0600, written atomically) on first use. Same file -> same peer id."""
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.crypto.keys import KeyPair, KeyType
    from libp2p.crypto.serialization import deserialize_private_key

    path = Path(data_dir) / IDENTITY_FILE
    if path.exists():
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            log.warning("identity file %s had mode %o; tightening to %o", path, mode, IDENTITY_FILE_MODE)
            os.chmod(path, IDENTITY_FILE_MODE)
        try:
            key = deserialize_private_key(path.read_bytes())
        except Exception as e:
            raise ValueError(f"{path} is not a libp2p private key: {e}") from e
        if key.get_type() != KeyType.Ed25519:
            raise ValueError(f"{path} holds a {key.get_type().name} key; an Ed25519 key is required")
        return KeyPair(key, key.get_public_key())
    path.parent.mkdir(parents=True, exist_ok=True)
    key_pair = create_new_key_pair()
    tmp = path.with_name(f".{IDENTITY_FILE}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, IDENTITY_FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(key_pair.private_key.serialize())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    log.info("created identity %s", path)
    return key_pair
