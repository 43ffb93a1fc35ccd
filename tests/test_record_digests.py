"""docker/record_digests.py against a registry and a Maven repository served on loopback: the
digest recorded is the one of the bytes the registry serves (after its token dance), a registry
whose header disagrees is refused, and the RAPIDS jar's checksum is recorded only under a valid
signature of the named key."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "docker" / "record_digests.py"
sys.path.insert(0, str(REPO / "docker"))
import record_digests  # noqa: E402


class Registry(BaseHTTPRequestHandler):
    """Docker's distribution API as far as a manifest GET goes, behind a bearer token, plus
    plain files (the Maven repository)."""

    manifests: dict[str, bytes] = {}
    files: dict[str, bytes] = {}
    lie = False
    requests: list[str] = []

    def do_GET(self):
        type(self).requests.append(self.path)
        if self.path.startswith("/token"):
            return self._send(200, json.dumps({"token": "t0k"}).encode())
        if self.path in self.files:
            return self._send(200, self.files[self.path])
        if self.path not in self.manifests:
            return self._send(404, b"{}")
        if self.headers.get("Authorization") != "Bearer t0k":
            realm = f"http://127.0.0.1:{self.server.server_port}/token"
            return self._send(
                401, b"{}", {"WWW-Authenticate": f'Bearer realm="{realm}",service="test",scope="pull"'}
            )
        body = self.manifests[self.path]
        said = "sha256:" + hashlib.sha256(b"other" if self.lie else body).hexdigest()
        return self._send(200, body, {"Docker-Content-Digest": said})

    def _send(self, code, body, headers=None):
        self.send_response(code)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture()
def registry():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Registry.manifests, Registry.files, Registry.lie, Registry.requests = {}, {}, False, []
    for name, reference in record_digests.base_images().items():
        image = record_digests.ImageRef.parse(reference)
        Registry.manifests[f"/v2/{image.repository}/manifests/{image.tag}"] = json.dumps(
            {"schemaVersion": 2, "for": name}
        ).encode()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def _run(*args, digests: Path):
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--digests", str(digests), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def _empty_digests(tmp_path: Path) -> Path:
    path = tmp_path / "digests.env"
    shutil.copy(REPO / "docker" / "digests.env", path)
    return path


def test_every_base_image_gets_the_digest_of_the_manifest_its_registry_serves(registry, tmp_path):
    digests = _empty_digests(tmp_path)
    proc = _run("--registry", registry, digests=digests)
    assert proc.returncode == 0, proc.stderr
    recorded = record_digests.read_digests(digests)
    for name, reference in record_digests.base_images().items():
        image = record_digests.ImageRef.parse(reference)
        body = Registry.manifests[f"/v2/{image.repository}/manifests/{image.tag}"]
        assert recorded[name] == "sha256:" + hashlib.sha256(body).hexdigest(), name
    assert recorded["RAPIDS_JAR_SHA256"] == "" and "--rapids-keyring" in proc.stderr
    assert any(r.startswith("/token") for r in Registry.requests)
    assert "/v2/library/python/manifests/3.11-slim-bookworm" in Registry.requests
    assert _run("--check", digests=digests).returncode == 1  # the jar's line is still empty
    # Comments stay; the file build.sh reads still parses as before.
    assert (REPO / "docker" / "digests.env").read_text().count("#") == digests.read_text().count("#")


def test_a_registry_whose_digest_header_disagrees_with_its_bytes_changes_nothing(registry, tmp_path):
    digests = _empty_digests(tmp_path)
    before = digests.read_text()
    Registry.lie = True
    proc = _run("--registry", registry, digests=digests)
    assert proc.returncode == 2 and "bytes received" in proc.stderr
    assert digests.read_text() == before


def test_an_unknown_tag_is_refused_with_the_url_and_the_file_is_left_alone(registry, tmp_path):
    digests = _empty_digests(tmp_path)
    before = digests.read_text()
    Registry.manifests.clear()
    proc = _run("--registry", registry, "--only", "TF_BASE_DIGEST", digests=digests)
    assert proc.returncode == 2 and "HTTP 404" in proc.stderr and "tensorflow" in proc.stderr
    assert digests.read_text() == before


def _gpg(home: Path, *args: str, **kwargs):
    return subprocess.run(
        ["gpg", "--homedir", str(home), "--batch", "--pinentry-mode", "loopback", "--passphrase", "", *args],
        capture_output=True,
        check=True,
        **kwargs,
    )


@pytest.mark.skipif(shutil.which("gpg") is None, reason="gpg is not installed")
def test_the_rapids_jar_is_recorded_only_under_a_valid_signature_of_the_named_key(registry, tmp_path):
    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    try:
        _signed_jar_is_recorded_only_under_its_key(home, registry, tmp_path)
    finally:  # key generation starts a gpg-agent for this home: it must not outlive the test
        if shutil.which("gpgconf"):
            subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"], capture_output=True)


def _signed_jar_is_recorded_only_under_its_key(home: Path, registry: str, tmp_path: Path):
    _gpg(home, "--quick-gen-key", "release@example.invalid", "ed25519", "sign", "never")
    fingerprint = [
        line.split(":")[9]
        for line in _gpg(home, "--with-colons", "--list-keys", text=True).stdout.splitlines()
        if line.startswith("fpr:")
    ][0]
    keyring = tmp_path / "release.gpg"
    keyring.write_bytes(_gpg(home, "--export", fingerprint).stdout)
    jar = b"PK\x03\x04 a jar's bytes"
    (tmp_path / "jar").write_bytes(jar)
    _gpg(home, "--armor", "--detach-sign", "-o", str(tmp_path / "jar.asc"), str(tmp_path / "jar"))
    url_path = record_digests.rapids_jar_url(None).removeprefix(record_digests.MAVEN_CENTRAL)
    Registry.files = {url_path: jar, url_path + ".asc": (tmp_path / "jar.asc").read_bytes()}
    digests = _empty_digests(tmp_path)
    common = ["--maven", registry, "--only", "RAPIDS_JAR_SHA256", "--rapids-keyring", str(keyring)]

    proc = _run(*common, "--rapids-signer", "0" * 40, digests=digests)
    assert proc.returncode == 2 and "no valid signature" in proc.stderr
    assert record_digests.read_digests(digests)["RAPIDS_JAR_SHA256"] == ""

    Registry.files[url_path] = jar + b" replaced"
    proc = _run(*common, "--rapids-signer", fingerprint, digests=digests)
    assert proc.returncode == 2 and record_digests.read_digests(digests)["RAPIDS_JAR_SHA256"] == ""

    Registry.files[url_path] = jar
    proc = _run(*common, "--rapids-signer", fingerprint, digests=digests)
    assert proc.returncode == 0, proc.stderr
    assert record_digests.read_digests(digests)["RAPIDS_JAR_SHA256"] == hashlib.sha256(jar).hexdigest()
