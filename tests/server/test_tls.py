"""``serve --ssl-certfile/--ssl-keyfile``: the API over HTTPS, for the official openai client that trusts its CA.

A CA and a certificate for 127.0.0.1 are made here (cryptography); the answers over TLS equal LLM.generate,
streamed too; a client that does not trust the CA is refused by its own check, plain HTTP gets no answer, and
files that do not make a certificate and its key are a usage error before the model loads.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

import httpx
import openai
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from core import LLM, SamplingParams
from tests.support.serve import WAIT_S, Server

ROOT = Path(__file__).resolve().parents[2]
MODEL = "llama"  # the served name: the test checkpoint's directory


def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_certificates(directory: Path) -> dict[str, Path]:
    """A CA, and a server certificate it signs for 127.0.0.1, with a key that matches it and one that does not."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, server_key, other_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "minisgl test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False),
                         critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    server = (x509.CertificateBuilder()
              .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
              .issuer_name(ca_name).public_key(server_key.public_key())
              .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
              .not_valid_after(now + datetime.timedelta(days=1))
              .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                             critical=False)
              .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
              .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
              .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                             critical=False)
              .sign(ca_key, hashes.SHA256()))
    files = {"ca": directory / "ca.pem", "cert": directory / "server.pem", "key": directory / "server-key.pem",
             "other_key": directory / "other-key.pem"}
    files["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files["cert"].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    files["key"].write_bytes(pem_key(server_key))
    files["other_key"].write_bytes(pem_key(other_key))
    return files


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def server(model_dirs, certs, tmp_path_factory):
    srv = Server(model_dirs["llama"], "--ssl-certfile", str(certs["cert"]), "--ssl-keyfile", str(certs["key"]),
                 "--max-running", "4", ca=certs["ca"], log=tmp_path_factory.mktemp("serve-tls") / "server.log")
    yield srv
    srv.stop()


def client(server: Server, trusted: ssl.SSLContext | None) -> openai.OpenAI:
    http = httpx.Client(verify=trusted if trusted is not None else True, timeout=WAIT_S)
    return openai.OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, http_client=http)


def test_the_openai_client_that_trusts_the_ca_gets_the_engines_answers(server, model_dirs):
    assert server.base.startswith("https://")
    want = LLM(str(model_dirs["llama"])).generate(["hello there"], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    api = client(server, server.tls)
    reply = api.completions.create(model=MODEL, prompt="hello there", max_tokens=8, temperature=0,
                                   extra_body={"ignore_eos": True})
    assert reply.choices[0].text == want["text"]
    chunks = list(api.completions.create(model=MODEL, prompt="hello there", max_tokens=8, temperature=0,
                                         stream=True, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks) == want["text"]
    assert "https://127.0.0.1:" in server.log()  # the start-up line names the scheme clients must use


def test_a_client_without_the_ca_refuses_and_plain_http_gets_no_answer(server):
    with pytest.raises(openai.APIConnectionError):
        client(server, None).models.list()  # the system's CAs do not know this certificate
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/health", timeout=WAIT_S)
    assert server.proc.poll() is None  # neither hurt the server
    assert server.metrics()["requests_running"] == 0


@pytest.mark.parametrize("given, fragment", [
    (("--ssl-certfile", "{cert}"), "'--ssl-certfile': it needs --ssl-keyfile too"),
    (("--ssl-keyfile", "{key}"), "'--ssl-keyfile': it needs --ssl-certfile too"),
    (("--ssl-certfile", "{cert}", "--ssl-keyfile", "{other_key}"), "the key is not this certificate's"),
    (("--ssl-certfile", "{key}", "--ssl-keyfile", "{key}"), "not a PEM certificate"),
    (("--ssl-certfile", "{missing}", "--ssl-keyfile", "{key}"), "'--ssl-certfile': {missing} is not a file"),
])
def test_files_that_are_not_a_certificate_and_its_key_are_a_usage_error(model_dirs, certs, given, fragment):
    names = {**{k: str(v) for k, v in certs.items()}, "missing": str(certs["ca"].parent / "nowhere.pem")}
    done = subprocess.run([sys.executable, "-m", "minisgl_cli", "serve", "--model", str(model_dirs["llama"]),
                           "--port", "0", *(arg.format(**names) for arg in given)],
                          cwd=ROOT, capture_output=True, text=True, timeout=WAIT_S)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment.format(**names) in lines[0], done.stderr
