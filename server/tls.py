"""TLS for both doors from the same files: grpc's server credentials and the HTTP door's ssl.SSLContext.

A file that cannot be read or does not hold what it should is one ConfigError line, before anything listens.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import grpc

from attnserve.config import ServerConfig
from attnserve.errors import ConfigError


def grpc_credentials(config: ServerConfig) -> grpc.ServerCredentials | None:
    if not config.tls_cert:
        return None
    assert config.tls_key is not None  # ServerConfig refuses a certificate without its key
    try:
        key, cert = Path(config.tls_key).read_bytes(), Path(config.tls_cert).read_bytes()
        ca = Path(config.tls_client_ca).read_bytes() if config.tls_client_ca else None
    except OSError as e:
        raise ConfigError(f"TLS file unreadable: {e.filename}: {e.strerror}") from None
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)


def http_ssl_context(config: ServerConfig) -> ssl.SSLContext | None:
    """With --tls-client-ca, clients must present a certificate it signed (mutual TLS), as over gRPC."""
    if not config.tls_cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(config.tls_cert, config.tls_key)
        if config.tls_client_ca:
            context.load_verify_locations(config.tls_client_ca)
            context.verify_mode = ssl.CERT_REQUIRED
    except OSError as e:  # ssl.SSLError is an OSError too
        raise ConfigError(f"TLS files unusable ({config.tls_cert}, {config.tls_key}"
                          f"{', ' + config.tls_client_ca if config.tls_client_ca else ''}): "
                          f"{e.strerror or getattr(e, 'reason', None) or e}") from None
    return context
