"""TLS and mutual TLS, turned on by flags, with certificates made for the test by a throwaway CA."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from pathlib import Path

import grpc
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from attnserve.client import Client, RequestError
from attnserve.config import ClientConfig
from tests.conftest import run_cli
from tests.serving import ServerProcess


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _issue(subject: str, issuer_key, issuer_name: x509.Name | None, *, ca: bool = False, server: bool = False):
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer_name or _name(subject))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    if not ca:
        builder = builder.add_extension(x509.ExtendedKeyUsage(
            [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    cert = builder.sign(issuer_key or key, hashes.SHA256())
    return key, cert


def _write(directory: Path, name: str, key, cert) -> tuple[str, str]:
    key_path, cert_path = directory / f"{name}.key", directory / f"{name}.pem"
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(key_path), str(cert_path)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, str]:
    directory = tmp_path_factory.mktemp("pki")
    ca_key, ca_cert = _issue("attnserve test CA", None, None, ca=True)
    _, ca_path = _write(directory, "ca", ca_key, ca_cert)
    server_key, server_cert = _write(directory, "server", *_issue("localhost", ca_key, ca_cert.subject, server=True))
    client_key, client_cert = _write(directory, "client", *_issue("a client", ca_key, ca_cert.subject))
    return {"ca": ca_path, "server_key": server_key, "server_cert": server_cert, "client_key": client_key,
            "client_cert": client_cert}


def ssl_context(ca: str, cert: str | None = None, key: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca)
    if cert:
        context.load_cert_chain(cert, key)
    return context


def _serve(artifacts, tmp_path, pki, *extra):
    process = ServerProcess(artifacts, "--tls-cert", pki["server_cert"], "--tls-key", pki["server_key"],
                            "--metrics-port", "-1", *extra, log_path=tmp_path / "server.log")
    return process


def test_tls_works_and_a_plaintext_client_is_refused(artifacts, tmp_path, pki):
    server = _serve(artifacts, tmp_path, pki)
    try:
        server.wait_serving(grpc.ssl_channel_credentials(Path(pki["ca"]).read_bytes()))
        with Client(config=ClientConfig(target=server.target, tls_ca=pki["ca"])) as client:
            assert client.embed(["over TLS"]).shape == (1, 384)
        with Client(config=ClientConfig(target=server.target, timeout=5)) as plaintext:
            with pytest.raises(RequestError) as error:
                plaintext.embed(["in the clear"])
        assert error.value.code == grpc.StatusCode.UNAVAILABLE
        # KServe v2 on the same port, over the same TLS: Triton's own client.
        import numpy as np
        import tritonclient.grpc as triton

        triton_client = triton.InferenceServerClient(server.target, ssl=True, root_certificates=pki["ca"])
        text = triton.InferInput("text", [1], "BYTES")
        text.set_data_from_numpy(np.array([b"over TLS, as Triton's client"], dtype=np.object_))
        assert triton_client.infer(triton_client.get_model_repository_index().models[0].name,
                                   [text]).as_numpy("embedding").shape == (1, 384)
        triton_client.close()
        # The CLI client takes the same flags.
        result = run_cli("embed", "over TLS from the CLI", "--target", server.target, "--tls-ca", pki["ca"])
        assert result.returncode == 0, result.stderr
        # HTTP is served over TLS from the same files.
        https = server.http_url.replace("http://127.0.0.1", "https://localhost")
        assert httpx.post(f"{https}/embed", json={"inputs": "over https"}, verify=ssl_context(pki["ca"]),
                          timeout=30).status_code == 200
        with pytest.raises(httpx.TransportError):
            httpx.post(f"{server.http_url}/embed", json={"inputs": "in the clear"}, timeout=5)
    finally:
        assert server.terminate() == 0, server.log_tail()


def test_mutual_tls_requires_a_client_certificate(artifacts, tmp_path, pki):
    server = _serve(artifacts, tmp_path, pki, "--tls-client-ca", pki["ca"])
    try:
        with_cert = dict(tls_ca=pki["ca"], tls_cert=pki["client_cert"], tls_key=pki["client_key"])
        server.wait_serving(grpc.ssl_channel_credentials(
            Path(pki["ca"]).read_bytes(), Path(pki["client_key"]).read_bytes(), Path(pki["client_cert"]).read_bytes()))
        with Client(config=ClientConfig(target=server.target, **with_cert)) as client:
            assert client.embed(["mutual TLS"]).shape == (1, 384)
        with Client(config=ClientConfig(target=server.target, tls_ca=pki["ca"], timeout=5)) as anonymous:
            with pytest.raises(RequestError) as error:
                anonymous.embed(["no client certificate"])
        assert error.value.code == grpc.StatusCode.UNAVAILABLE
        # And over HTTP: the same client CA.
        https = server.http_url.replace("http://127.0.0.1", "https://localhost")
        mutual = ssl_context(pki["ca"], pki["client_cert"], pki["client_key"])
        assert httpx.post(f"{https}/embed", json={"inputs": "mutual TLS"}, verify=mutual, timeout=30).status_code == 200
        with pytest.raises(httpx.TransportError):
            httpx.post(f"{https}/embed", json={"inputs": "no client certificate"}, verify=ssl_context(pki["ca"]),
                       timeout=5)
    finally:
        assert server.terminate() == 0, server.log_tail()


def test_bad_tls_flags_are_one_line_errors(artifacts, tmp_path, pki):
    from tests.conftest import assert_one_line_error

    assert_one_line_error(run_cli("serve", "--artifacts", artifacts, "--tls-cert", pki["server_cert"]),
                          "TLS needs both --tls-cert and --tls-key")
    assert_one_line_error(run_cli("serve", "--artifacts", artifacts, "--port", "0", "--metrics-port", "-1",
                                  "--tls-cert", str(tmp_path / "missing.pem"), "--tls-key", pki["server_key"]),
                          "TLS file unreadable", "missing.pem")
