"""Records docker/digests.env from the registries themselves: what a maintainer runs to pin the
images' bases by digest and the RAPIDS jar by checksum.

    python docker/record_digests.py                       # every base image of the Dockerfiles
    python docker/record_digests.py --only TF_BASE_DIGEST  # one of them
    python docker/record_digests.py --rapids-keyring nvidia.gpg --rapids-signer FINGERPRINT
    python docker/record_digests.py --check               # exit 1 unless every line is filled

Why a script and not hand-copied digests: a digest copied from a web page or another project's
Dockerfile cannot be told from a typo or from an old, unpatched image. Here each base image
reference is expanded from the Dockerfile's own FROM line and pyproject.toml's pins (so a new
TensorFlow pin asks for the new tag), its manifest is fetched from the registry over the
distribution API, and the digest recorded is the sha256 of the bytes received, checked against
the registry's Docker-Content-Digest. The RAPIDS jar's sha256 is recorded only after
``gpg --verify`` of its detached signature by the signer fingerprint the maintainer gives
(NVIDIA's release key, taken from NVIDIA's documentation, not from beside the jar).

``--registry URL`` sends every request to one registry (a pull-through mirror, or the tests'
registry on loopback); ``--maven URL`` does the same for the jar. Only the standard library and
the gpg binary are used, so this runs on any build host with Python 3.11+.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

DOCKER = Path(__file__).resolve().parent
DIGESTS = DOCKER / "digests.env"
DOCKERFILES = sorted(p for p in DOCKER.glob("Dockerfile.*") if p.suffix != ".dockerignore")
DOCKER_HUB = "https://registry-1.docker.io"
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
MANIFEST_TYPES = ", ".join(
    [
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ]
)
FROM_WITH_DIGEST = re.compile(r"^FROM\s+(\S+?)\$\{(\w+_DIGEST):\+@\$\{\2\}\}", re.M)
ARG_DEFAULT = re.compile(r"^ARG\s+(\w+)=(.*)$", re.M)
VARIABLE = re.compile(r"\$\{(\w+)\}")
TIMEOUT_S = 60


class RecordError(RuntimeError):
    """Something the registry or the signature check said no to; the message names it."""


@dataclass(frozen=True)
class ImageRef:
    """``[host/]repository:tag`` as docker reads it (Docker Hub's ``library/`` filled in)."""

    host: str | None
    repository: str
    tag: str

    @classmethod
    def parse(cls, reference: str) -> "ImageRef":
        name, _, tag = reference.rpartition(":")
        if not name or "/" in tag:
            raise RecordError(f"'{reference}' has no tag: a digest is recorded for a named tag")
        first, _, rest = name.partition("/")
        if rest and ("." in first or ":" in first or first == "localhost"):
            return cls(first, rest, tag)
        return cls(None, name if "/" in name else f"library/{name}", tag)


def build_args() -> dict[str, str]:
    """The version ARGs docker/build.sh passes (pyproject.toml's pins, via pins.py)."""
    out = subprocess.run(
        [sys.executable, str(DOCKER / "pins.py"), "build-args"], capture_output=True, text=True, check=True
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def expand(text: str, values: dict[str, str]) -> str:
    def value(match: re.Match) -> str:
        if match.group(1) not in values:
            raise RecordError(f"'{text}' uses ${{{match.group(1)}}}, which has no value")
        return values[match.group(1)]

    return VARIABLE.sub(value, text)


def dockerfile_values(text: str, pins: dict[str, str]) -> dict[str, str]:
    """ARG defaults of a Dockerfile, expanded, with the pins winning as build.sh passes them."""
    values = dict(pins)
    for name, default in ARG_DEFAULT.findall(text):
        if name not in pins and default:
            values[name] = expand(default, values)
    return values


def base_images(dockerfiles=DOCKERFILES) -> dict[str, str]:
    """Digest ARG name -> the image reference its FROM line names, over every Dockerfile."""
    pins, images = build_args(), {}
    for path in dockerfiles:
        text = path.read_text()
        values = dockerfile_values(text, pins)
        for reference, arg in FROM_WITH_DIGEST.findall(text):
            image = expand(reference, values)
            if images.setdefault(arg, image) != image:
                raise RecordError(f"{arg} names {images[arg]} and {image} ({path.name})")
    return images


def _get(url: str, headers: dict[str, str]):
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 (https or a mirror)
    return urllib.request.urlopen(request, timeout=TIMEOUT_S)  # noqa: S310 (https or a mirror)


def _bearer_token(challenge: str) -> str:
    """A pull token from the realm a registry's 401 names (anonymous, as docker pull does)."""
    fields = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    if not challenge.lower().startswith("bearer") or "realm" not in fields:
        raise RecordError(f"the registry asks for '{challenge}', not a bearer token")
    query = urllib.parse.urlencode({k: v for k, v in fields.items() if k in ("service", "scope")})
    with _get(f"{fields['realm']}?{query}", {}) as response:
        body = json.load(response)
    return body.get("token") or body["access_token"]


def manifest_digest(image: ImageRef, registry: str | None) -> str:
    """sha256 of the manifest bytes the registry serves for the tag, checked against its
    Docker-Content-Digest header (a registry or proxy that says otherwise is refused)."""
    base = (registry or (f"https://{image.host}" if image.host else DOCKER_HUB)).rstrip("/")
    url = f"{base}/v2/{image.repository}/manifests/{image.tag}"
    headers = {"Accept": MANIFEST_TYPES}
    try:
        try:
            response = _get(url, headers)
        except urllib.error.HTTPError as err:
            if err.code != 401:
                raise
            headers["Authorization"] = f"Bearer {_bearer_token(err.headers['WWW-Authenticate'])}"
            response = _get(url, headers)
        with response:
            body, said = response.read(), response.headers.get("Docker-Content-Digest")
    except urllib.error.HTTPError as err:
        raise RecordError(f"{url}: HTTP {err.code}") from None
    except urllib.error.URLError as err:
        raise RecordError(f"{url}: {err.reason}") from None
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    if said is not None and said != digest:
        raise RecordError(f"{url}: the registry says {said} but the bytes received are {digest}")
    return digest


def verified_jar_sha256(jar_url: str, keyring: Path, signer: str) -> str:
    """The jar's sha256, once gpg has verified its detached signature (URL + .asc) as made by
    the given key fingerprint; anything else raises."""
    with tempfile.TemporaryDirectory() as tmp:
        jar, asc = Path(tmp) / "jar", Path(tmp) / "jar.asc"
        for url, path in ((jar_url, jar), (jar_url + ".asc", asc)):
            try:
                with _get(url, {}) as response, open(path, "wb") as out:
                    while chunk := response.read(1 << 20):
                        out.write(chunk)
            except urllib.error.URLError as err:
                raise RecordError(f"{url}: {getattr(err, 'code', None) or err.reason}") from None
        status = subprocess.run(
            [
                "gpg",
                "--batch",
                "--no-default-keyring",
                "--keyring",
                str(keyring.resolve()),
                "--trust-model",
                "always",
                "--status-fd",
                "1",
                "--verify",
                str(asc),
                str(jar),
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "GNUPGHOME": tmp},
        )
        signers = re.findall(r"^\[GNUPG:\] VALIDSIG (\w+)", status.stdout, re.M)
        wanted = signer.replace(" ", "").upper()
        if status.returncode != 0 or wanted not in (s.upper() for s in signers):
            raise RecordError(
                f"{jar_url}: no valid signature by {wanted} "
                f"(gpg said: {status.stderr.strip().splitlines()[-1:]})"
            )
        return hashlib.sha256(jar.read_bytes()).hexdigest()


def rapids_jar_url(maven: str | None) -> str:
    """The jar Dockerfile.preprocess-gpu downloads by default (its RAPIDS_JAR_URL ARG)."""
    text = (DOCKER / "Dockerfile.preprocess-gpu").read_text()
    url = dockerfile_values(text, build_args())["RAPIDS_JAR_URL"]
    return url.replace(MAVEN_CENTRAL, maven.rstrip("/")) if maven else url


def read_digests(path: Path) -> dict[str, str]:
    return dict(re.findall(r"^([A-Z0-9_]+)=(.*)$", path.read_text(), re.M))


def write_digests(path: Path, recorded: dict[str, str]) -> None:
    """Fills the NAME= lines in place (comments kept), through a temporary file and a rename."""
    text = path.read_text()
    for name, value in recorded.items():
        text, count = re.subn(rf"^{name}=.*$", f"{name}={value}", text, flags=re.M)
        if count != 1:
            raise RecordError(f"{path} has {count} lines for {name}: expected exactly one")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def record(args: argparse.Namespace) -> dict[str, str]:
    recorded = {}
    for name, reference in sorted(base_images().items()):
        if args.only and name not in args.only:
            continue
        recorded[name] = manifest_digest(ImageRef.parse(reference), args.registry)
        print(f"{name}={recorded[name]}  # {reference}")
    wants_jar = not args.only or "RAPIDS_JAR_SHA256" in args.only
    if wants_jar and args.rapids_keyring:
        recorded["RAPIDS_JAR_SHA256"] = verified_jar_sha256(
            rapids_jar_url(args.maven), Path(args.rapids_keyring), args.rapids_signer
        )
        print(f"RAPIDS_JAR_SHA256={recorded['RAPIDS_JAR_SHA256']}")
    elif wants_jar:
        print(
            "RAPIDS_JAR_SHA256 left as it is: give --rapids-keyring and --rapids-signer "
            "to record it from a verified signature",
            file=sys.stderr,
        )
    return recorded


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--digests", type=Path, default=DIGESTS, help="the file to fill")
    parser.add_argument("--only", action="append", help="record only this NAME (repeatable)")
    parser.add_argument("--registry", help="send every manifest request to this registry URL")
    parser.add_argument("--maven", help="a Maven repository URL in place of Maven Central")
    parser.add_argument("--rapids-keyring", help="a gpg keyring holding NVIDIA's release key")
    parser.add_argument("--rapids-signer", help="that key's fingerprint")
    parser.add_argument(
        "--check", action="store_true", help="record nothing; exit 1 unless every line of the file is filled"
    )
    args = parser.parse_args(argv)
    if bool(args.rapids_keyring) != bool(args.rapids_signer):
        parser.error("--rapids-keyring and --rapids-signer go together")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.check:
        empty = [name for name, value in read_digests(args.digests).items() if not value]
        for name in empty:
            print(f"{args.digests.name}: {name} is empty", file=sys.stderr)
        return 1 if empty else 0
    try:
        write_digests(args.digests, record(args))
    except RecordError as err:
        print(f"record_digests: {err}; {args.digests.name} left unchanged", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
