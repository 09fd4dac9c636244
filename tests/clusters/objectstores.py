"""Object stores on 127.0.0.1 for delta-rs: an S3 API (moto's server mode, PyPI ``moto[server]``)
and Azure Blob (Azurite, npm ``azurite``), each a process of its own on a free port.

Each gives ``storage_options`` for ``deltalake`` (the same dict works for
``deltalake.fs.DeltaStorageHandler``, the way to read and write small state files next to the
tables), ``new_root()`` (a fresh bucket or container, as the URI of its root) and ``pyarrow_fs()``
(pyarrow's own filesystem for the store).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .processes import ServerProcess, StartError

__all__ = [
    "AZURITE_VERSION",
    "Azurite",
    "MotoS3",
    "azurite_blob_command",
    "state_filesystem",
]

START_TIMEOUT = 60.0

#: AWS SDKs (botocore, pyarrow's aws-sdk-cpp, delta-rs' aws-config) must never ask the EC2
#: metadata address for a region or credentials: everything is given, and only 127.0.0.1 is
#: ours to talk to.
NO_IMDS = {"AWS_EC2_METADATA_DISABLED": "true"}

#: Azurite 3.37.0 is the first that honours ``startFrom`` in List Blobs, which delta-rs
#: (object_store 0.13) sends to list a table's log from a version on: with 3.35.0 (the last
#: whose package.json accepts Node.js 20) the listing starts at version 0 and every MERGE or
#: retried commit fails with ``Invalid table version: N``. 3.37.0 declares node >= 22, npm
#: installs it on Node.js 20 with a warning, and its Blob service runs there.
AZURITE_VERSION = "3.37.0"

#: Azurite's fixed development account: the name and key are public constants of the emulator
#: (documented by Microsoft), not secrets.
DEVSTORE_ACCOUNT = "devstoreaccount1"
DEVSTORE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)

TESTS_DIR = Path(__file__).resolve().parents[1]


def _root_name() -> str:
    """A bucket or container name valid on both stores (3-63 lowercase letters and digits)."""
    return f"pgcdc{uuid.uuid4().hex[:20]}"


@dataclass(slots=True)
class MotoS3:
    """moto's server mode: S3 at ``endpoint`` with any access key (moto checks none)."""

    log_dir: Path
    ignore_conditional_writes: bool = False
    endpoint: str = ""
    proc: ServerProcess | None = None

    def start(self) -> MotoS3:
        argv = [sys.executable, "-m", "clusters.moto_server", "--port", "0"]
        if self.ignore_conditional_writes:
            argv.append("--ignore-conditional-writes")
        name = "moto-no-conditional-writes" if self.ignore_conditional_writes else "moto"
        self.proc = ServerProcess(
            name,
            argv,
            log=self.log_dir / f"{name}.log",
            cwd=self.log_dir,
            env={"PYTHONPATH": str(TESTS_DIR), **NO_IMDS},
        ).start()
        try:
            found = self.proc.wait_for_log(r"listening on (http://\S+)", START_TIMEOUT)
        except BaseException:
            self.proc.stop()
            raise
        self.endpoint = found.group(1)
        return self

    @property
    def storage_options(self) -> dict[str, str]:
        """delta-rs' options. Nothing more is needed for safe concurrent commits: delta-rs
        1.6 writes each ``_delta_log/N.json`` with ``If-None-Match: *`` (whatever
        ``AWS_S3_ALLOW_UNSAFE_RENAME`` or ``aws_conditional_put`` say), which moto honours."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": "pgcdc-test",
            "AWS_SECRET_ACCESS_KEY": "pgcdc-test",
            "AWS_REGION": "us-east-1",
        }

    def pyarrow_fs(self) -> Any:
        import pyarrow.fs as pafs

        os.environ.update(NO_IMDS)
        return pafs.S3FileSystem(
            access_key="pgcdc-test",
            secret_key="pgcdc-test",
            region="us-east-1",
            endpoint_override=self.endpoint,
            scheme="http",
            allow_bucket_creation=True,
            allow_bucket_deletion=True,
        )

    def new_root(self) -> str:
        """A new, empty bucket: ``s3://NAME``."""
        name = _root_name()
        self.pyarrow_fs().create_dir(name)
        return f"s3://{name}"

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


def azurite_blob_command() -> Path:
    """``azurite-blob`` of Azurite ``AZURITE_VERSION``: ``$PGCDC_AZURITE_BLOB`` when set, else
    the one npm installed under ``~/.cache/pgcdc-tests`` (installed there on first use; CI
    does it before the tests, see ``.ci/run``)."""
    given = os.environ.get("PGCDC_AZURITE_BLOB")
    if given:
        return Path(given)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    prefix = cache / "pgcdc-tests" / f"azurite-{AZURITE_VERSION}"
    command = prefix / "node_modules" / ".bin" / "azurite-blob"
    if command.exists():
        return command
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise StartError("Azurite needs Node.js and npm (Node.js 20 or later)")
    done = subprocess.run(
        [
            npm,
            "install",
            "--prefix",
            str(prefix),
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
            f"azurite@{AZURITE_VERSION}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0 or not command.exists():
        raise StartError(f"npm install azurite@{AZURITE_VERSION} failed:\n{done.stderr[-2000:]}")
    return command


@dataclass(slots=True)
class Azurite:
    """Azurite's Blob service (no queue, no table) on 127.0.0.1, its data in ``log_dir``."""

    log_dir: Path
    endpoint: str = ""
    proc: ServerProcess | None = None
    workspace: Path = field(default_factory=Path)

    def start(self) -> Azurite:
        self.workspace = self.log_dir / "azurite-data"
        self.proc = ServerProcess(
            "azurite",
            [
                str(azurite_blob_command()),
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                "0",
                "--location",
                str(self.workspace),
                "--skipApiVersionCheck",
                "--loose",
                # Azurite reports usage to Microsoft unless told not to: no traffic leaves.
                "--disableTelemetry",
            ],
            log=self.log_dir / "azurite.log",
            cwd=self.workspace,
        ).start()
        try:
            found = self.proc.wait_for_log(
                r"successfully listens on (http://\S+?)/?\s", START_TIMEOUT
            )
        except BaseException:
            self.proc.stop()
            raise
        self.endpoint = found.group(1)
        return self

    @property
    def storage_options(self) -> dict[str, str]:
        """delta-rs' options for ``az://CONTAINER/path`` and
        ``abfss://CONTAINER@devstoreaccount1.dfs.core.windows.net/path``. (The emulator
        switch ``AZURE_STORAGE_USE_EMULATOR`` would take the port from the process's
        ``AZURITE_BLOB_STORAGE_URL`` environment variable only, else 10000.)"""
        return {
            "AZURE_STORAGE_ACCOUNT_NAME": DEVSTORE_ACCOUNT,
            "AZURE_STORAGE_ACCOUNT_KEY": DEVSTORE_KEY,
            "AZURE_STORAGE_ENDPOINT": f"{self.endpoint}/{DEVSTORE_ACCOUNT}",
            "AZURE_ALLOW_HTTP": "true",
        }

    def pyarrow_fs(self) -> Any:
        import pyarrow.fs as pafs

        authority = self.endpoint.removeprefix("http://")
        # The dfs endpoint too: pyarrow asks it whether the account has a hierarchical
        # namespace before its first write (Azurite answers as a flat blob account).
        return pafs.AzureFileSystem(
            account_name=DEVSTORE_ACCOUNT,
            account_key=DEVSTORE_KEY,
            blob_storage_authority=authority,
            blob_storage_scheme="http",
            dfs_storage_authority=authority,
            dfs_storage_scheme="http",
        )

    def new_root(self) -> str:
        """A new, empty container: ``az://NAME``."""
        name = _root_name()
        self.pyarrow_fs().create_dir(name)
        return f"az://{name}"

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


def state_filesystem(root: str, storage_options: dict[str, str]) -> Any:
    """A pyarrow filesystem rooted at ``root`` (any URI deltalake takes: file, s3, az,
    abfss, gs) over delta-rs' own object store, with the targets' storage options: paths
    are relative to ``root``. For small state files (JSON) beside the tables; a file is
    written with one PUT on close, so readers see the old or the new content, never a part.

    deltalake 1.6.6's ``DeltaStorageHandler.open_output_stream`` cannot be written through
    pyarrow (pyarrow hands the stream a ``pyarrow.Buffer``, delta-rs takes only ``bytes``:
    ``TypeError: 'Buffer' object is not an instance of 'bytes'``); the subclass below gives
    delta-rs bytes."""
    import pyarrow as pa
    import pyarrow.fs as pafs
    from deltalake.fs import DeltaStorageHandler

    class BytesOnly:
        def __init__(self, stream: Any) -> None:
            self.stream = stream

        def write(self, data: Any) -> int:
            return int(self.stream.write(bytes(data)))

        def __getattr__(self, name: str) -> Any:
            return getattr(self.stream, name)

    class StateHandler(DeltaStorageHandler):
        def open_output_stream(self, path: str, metadata: dict[str, str] | None = None) -> Any:
            return pa.PythonFile(BytesOnly(self._handler.open_output_stream(path, metadata)), "w")

    return pafs.PyFileSystem(StateHandler(root, storage_options))
