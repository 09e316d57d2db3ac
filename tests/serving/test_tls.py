"""TLS on both ports with a self-signed certificate."""
from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import urllib.request

import grpc
import pytest

from serving.client.caption_client import CaptionClient, CaptionError, ClientOptions
from tests.serving.conftest import RED
from tests.serving.fixtures import expected_caption, solid_image


def self_signed(tmp_path):
    """(cert path, key path) for CN=localhost with SANs localhost and 127.0.0.1."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "server.crt", tmp_path / "server.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


def test_tls_grpc_and_rest(make_base, start_server, tmp_path):
    cert, key = self_signed(tmp_path)
    server = start_server(make_base({1: "image"}), ssl_cert=cert, ssl_key=key)
    assert "tls=on" in server.describe() and server.rest_url.startswith("https://")
    with CaptionClient(server.grpc_address, root_certificates=cert) as client:
        assert client.caption([solid_image(RED)])[0]["caption"] == expected_caption(RED)
    with CaptionClient(server.grpc_address, timeout=5, options=ClientOptions(max_attempts=1)) as plaintext:
        with pytest.raises(CaptionError) as info:
            plaintext.caption([solid_image(RED)])
        assert info.value.code == grpc.StatusCode.UNAVAILABLE
    context = ssl.create_default_context(cafile=cert)
    with urllib.request.urlopen(server.rest_url + "/v1/models/captioner", context=context,
                                timeout=30) as response:
        assert json.loads(response.read())["model_version_status"][0]["state"] == "AVAILABLE"
    with pytest.raises(urllib.error.URLError):  # untrusted without the CA
        urllib.request.urlopen(server.rest_url + "/v1/models/captioner", timeout=30)


def _ssl_config_file(tmp_path, cert: str, key: str, client_verify: bool) -> str:
    """A TF Serving `--ssl_config_file` (SSLConfig text: PEM contents, not paths)."""
    from serving.server.config_protos import SSLConfig
    config = SSLConfig(server_key=open(key).read(), server_cert=open(cert).read(),
                       custom_ca=open(cert).read() if client_verify else "",
                       client_verify=client_verify)
    path = tmp_path / "ssl.config"
    path.write_text(str(config))
    return str(path)


def test_ssl_config_file_secures_grpc_and_leaves_rest_plain(make_base, start_server, tmp_path):
    from serving.server.config_protos import SSLConfig, parse_text_file
    cert, key = self_signed(tmp_path)
    config = parse_text_file(_ssl_config_file(tmp_path, cert, key, False), SSLConfig)
    server = start_server(make_base({1: "image"}), ssl_config=config)
    assert "tls=on" in server.describe() and server.rest_url.startswith("http://")
    with CaptionClient(server.grpc_address, root_certificates=cert) as client:
        assert client.caption([solid_image(RED)])[0]["caption"] == expected_caption(RED)
    with urllib.request.urlopen(server.rest_url + "/v1/models/captioner", timeout=30) as response:
        assert response.status == 200  # TF Serving's REST port has no TLS either


def test_ssl_config_client_verify_requires_a_client_certificate(make_base, start_server,
                                                                tmp_path):
    from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc

    from serving.server.config_protos import SSLConfig, parse_text_file
    cert, key = self_signed(tmp_path)
    config = parse_text_file(_ssl_config_file(tmp_path, cert, key, True), SSLConfig)
    server = start_server(make_base({1: "image"}), ssl_config=config)
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "captioner"
    pem = {name: open(path, "rb").read() for name, path in (("cert", cert), ("key", key))}
    with_client_cert = grpc.ssl_channel_credentials(pem["cert"], pem["key"], pem["cert"])
    stub = model_service_pb2_grpc.ModelServiceStub(
        grpc.secure_channel(server.grpc_address, with_client_cert))
    assert stub.GetModelStatus(request, timeout=30).model_version_status[0].version == 1
    anonymous = model_service_pb2_grpc.ModelServiceStub(
        grpc.secure_channel(server.grpc_address, grpc.ssl_channel_credentials(pem["cert"])))
    with pytest.raises(grpc.RpcError) as info:
        anonymous.GetModelStatus(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
