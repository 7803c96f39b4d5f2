"""The TOML config file: precedence (flags > environment > file > defaults), and a file
with an unknown key or a wrong type refused at start with the key's name (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from metaservice.cli import app
from metaservice.settings import CONFIG_ENV, ConfigFileError, Settings
from tests.faults.processes import ServiceProcess
from tests.metaservice.helpers import API

FILE = """
port = 9100
barrier_interval_ms = 250
max_page_size = 5
max_tables_per_query = 2
log_format = "json"
openlineage_api_key = "from-file"

[catalog_properties]
type = "rest"
uri = "https://catalog.example.com"
"""


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "metaservice.toml"
    path.write_text(FILE)
    for name in ("PORT", "BARRIER_INTERVAL_MS", "MAX_PAGE_SIZE", "LOG_FORMAT", "CONFIG"):
        # set first, so that the value is restored even when `start` sets it meanwhile
        monkeypatch.setenv(f"METASERVICE_{name}", "")
        monkeypatch.delenv(f"METASERVICE_{name}")
    return path


def test_flags_beat_the_environment_which_beats_the_file_which_beats_the_defaults(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert Settings().port == 8765  # no file named: the defaults
    monkeypatch.setenv(CONFIG_ENV, str(config))
    monkeypatch.setenv("METASERVICE_BARRIER_INTERVAL_MS", "500")
    settings = Settings(port=9200)
    assert settings.port == 9200  # flag over file
    assert settings.barrier_interval_ms == 500  # environment over file
    assert settings.max_page_size == 5  # file over default
    assert settings.log_format == "json"
    assert settings.catalog_properties == {"type": "rest", "uri": "https://catalog.example.com"}
    assert settings.max_lineage_depth == 1000  # default


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("prot = 8765\n", "unknown key 'prot'"),
        ('port = "8765"\n', "port: Input should be a valid integer (got '8765')"),
        ("barrier_interval_ms = 0\n", "barrier_interval_ms: Input should be greater than 0"),
        ('log_format = "xml"\n', "log_format: Input should be 'text' or 'json'"),
        ("[catalog_properties]\nuri = 1\n", "catalog_properties.uri: Input should be a valid str"),
        ("auth_required = yes\n", "not valid TOML"),
    ],
)
def test_a_bad_config_file_stops_start_with_the_key_and_exit_status_2(
    config: Path, text: str, problem: str
) -> None:
    config.write_text(text)
    result = CliRunner().invoke(app, ["start", "--config", str(config)])
    assert result.exit_code == 2, result.output
    assert problem in result.output
    assert str(config) in result.output
    assert "Traceback" not in result.output
    with pytest.raises(ConfigFileError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        Settings()  # start named the file in the environment, as its workers read it


def test_a_missing_config_file_is_an_error_not_the_defaults(config: Path) -> None:
    result = CliRunner().invoke(
        app, ["start"], env={CONFIG_ENV: str(config.parent / "nowhere.toml")}
    )
    assert result.exit_code == 2, result.output
    assert "nowhere.toml: no such file" in result.output


def test_a_wrong_environment_variable_is_exit_status_2_with_its_key(config: Path) -> None:
    result = CliRunner().invoke(app, ["start"], env={"METASERVICE_PORT": "eighty"})
    assert result.exit_code == 2, result.output
    assert "setting port: Input should be a valid integer" in result.output


def test_start_reads_the_config_file_under_flags_and_environment(
    tmp_path: Path, config: Path
) -> None:
    """A real ``metaservice start --config``: the flag's port is served (not the file's),
    the file's JSON log format and table bound are used, and the environment's page bound
    beats the file's."""
    log = tmp_path / "service.log"
    with (
        ServiceProcess(
            f"sqlite:///{tmp_path / 'ms.db'}",
            log,
            extra_args=["--config", str(config)],
            env={"METASERVICE_MAX_PAGE_SIZE": "7"},
        ) as service,
        httpx.Client(base_url=service.url, timeout=10) as http,
    ):
        assert service.port != 9100
        assert http.get(f"{API}/jobs", params={"limit": 7}).status_code == 200
        assert http.get(f"{API}/jobs", params={"limit": 8}).status_code == 413
        three = http.get(f"{API}/versions/consistent", params={"tables": "a.x,a.y,a.z"})
        assert three.status_code == 413, three.text
        assert "at most 2 per query" in three.text
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
    access = [x["path"] for x in lines if x["logger"] == "uvicorn.access"]
    assert f"{API}/jobs?limit=8" in access
