"""Issue 23 (items 1b, 8): keys that cannot be exported by mistake, and the operator's commands as a
user meets them: run discovery, --set values, typo hints, resume limits, timeline cropping."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from prl_actors.transport.auth import KeysError, create_keys, export_keys, run_key_names

runner = CliRunner()


def run_cli(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    assert "Traceback" not in result.output
    return result.exit_code, result.output


# --- 1b: keys ------------------------------------------------------------------------------------


def test_export_of_a_name_never_created_is_an_error(tmp_path: Path) -> None:
    keys = tmp_path / "run" / "keys"
    create_keys(keys, run_key_names())
    code, out = run_cli("keys", "export", "worker-gpu1", "--out", str(tmp_path / "b"), "--run-dir", str(keys.parent))
    assert code == 2
    assert "no key named 'worker-gpu1'" in out and "keys create worker-gpu1" in out
    assert not (tmp_path / "b").exists()  # nothing written, least of all worker.key_secret


def test_no_bundle_carries_a_role_key_that_acts_as_every_member(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    create_keys(keys, [*run_key_names(), "worker-gpu1"])
    for shared in ("worker", "env"):
        with pytest.raises(KeysError, match="every"):
            export_keys(keys, shared, tmp_path / shared)
    files = export_keys(keys, "worker-gpu1", tmp_path / "b")
    assert [f for f in files if f.endswith(".key_secret")] == ["worker-gpu1.key_secret"]
    assert export_keys(keys, "operator", tmp_path / "op")[0] == "operator.key_secret"  # one operator: fine
