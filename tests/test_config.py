"""Configuration: interpolation, secrets from the environment, errors that name the key path."""

from __future__ import annotations

import pytest

from gateway.config import ConfigError, load_config, parse_duration


def write(tmp_path, text: str):  # noqa: ANN001, ANN201
    path = tmp_path / "config.yml"
    path.write_text(text)
    return path


def test_defaults_without_a_file_use_sqlite_and_no_channels(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GATEWAY_CONFIG", raising=False)
    config = load_config(env={})
    assert config.database.url.startswith("sqlite+aiosqlite:///")
    assert not config.telegram.enabled and not config.slack.enabled
    assert config.agent.max_rounds == 25


def test_wrong_type_names_the_file_and_key_path(tmp_path):
    path = write(tmp_path, "llm:\n  context_window: big\n")
    with pytest.raises(ConfigError) as error:
        load_config(path, env={})
    assert str(error.value) == f'{path}: llm.context_window: expected an integer or "auto", got "big"'


def test_unknown_keys_are_rejected_with_their_path(tmp_path):
    path = write(tmp_path, "agent:\n  max_round: 3\n")
    with pytest.raises(ConfigError, match=r"agent\.max_round: unknown key"):
        load_config(path, env={})


def test_env_interpolation_with_defaults_and_types(tmp_path):
    path = write(tmp_path, "http:\n  port: ${PORT:-9000}\nllm:\n  model: ${MODEL}\n")
    config = load_config(path, env={"MODEL": "m1"})
    assert (config.http.port, config.llm.model) == (9000, "m1")
    assert load_config(path, env={"MODEL": "m2", "PORT": "8181"}).http.port == 8181


def test_an_unset_variable_without_default_is_an_error_naming_the_key(tmp_path):
    path = write(tmp_path, "llm:\n  model: ${MODEL}\n")
    with pytest.raises(ConfigError, match=r"llm\.model: environment variable MODEL is not set"):
        load_config(path, env={})


def test_secrets_come_only_from_the_environment(tmp_path):
    path = write(tmp_path, "telegram:\n  token: 123:abc\n")
    with pytest.raises(ConfigError, match=r"telegram\.token: secrets are read from the environment only"):
        load_config(path, env={})
    from_env = load_config(write(tmp_path, "telegram: {}\n"), env={"TELEGRAM_BOT_TOKEN": "123:abc"})
    assert from_env.telegram.token == "123:abc" and from_env.telegram.enabled


def test_dotenv_beside_the_config_is_read_without_overriding(tmp_path, monkeypatch):
    (tmp_path / ".env").write_text("LLM_MODEL_FROM_DOTENV=dotenv-model\nexport ALREADY=from-file\n")
    monkeypatch.setenv("ALREADY", "from-env")
    monkeypatch.delenv("LLM_MODEL_FROM_DOTENV", raising=False)
    path = write(tmp_path, "llm:\n  model: ${LLM_MODEL_FROM_DOTENV}\nagent:\n  system_prompt: ${ALREADY}\n")
    config = load_config(path)
    assert (config.llm.model, config.agent.system_prompt) == ("dotenv-model", "from-env")


def test_database_url_env_overrides_the_file(tmp_path):
    path = write(tmp_path, "database:\n  url: sqlite+aiosqlite:///one.db\n")
    config = load_config(path, env={"GATEWAY_DATABASE_URL": "postgresql+asyncpg://x@h/db"})
    assert config.database.url == "postgresql+asyncpg://x@h/db"


def test_an_explicit_missing_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="no such configuration file"):
        load_config(tmp_path / "missing.yml", env={})


def test_the_shipped_config_file_is_valid(monkeypatch):
    from pathlib import Path

    config = load_config(Path(__file__).resolve().parent.parent / "config.yml", env={})
    assert config.inbox.busy_mode == "steer" and config.approvals.expire_after == 24 * 3600
    assert (config.telegram.rich_messages, config.telegram.stop_button) == ("off", "keep")


def test_a_bare_off_or_on_of_a_telegram_switch_is_the_word(tmp_path):
    """YAML reads `off` as false: the Telegram settings whose values are words take it back."""
    path = tmp_path / "config.yml"
    path.write_text("telegram:\n  streaming: off\n  stop_button: off\n  rich_messages: on\n")
    telegram = load_config(path, env={}).telegram
    assert (telegram.streaming, telegram.stop_button, telegram.rich_messages) == ("off", "off", "on")


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90), ("90s", 90), ("15m", 900), ("2h", 7200), ("1d", 86400), (5, 5)]
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_bad_duration_is_named(tmp_path):
    path = write(tmp_path, "approvals:\n  expire_after: soon\n")
    with pytest.raises(ConfigError, match=r"approvals\.expire_after: .*duration"):
        load_config(path, env={})


def test_the_configuration_reference_is_current():
    from pathlib import Path

    from gateway.config.reference import render

    doc = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
    assert doc.read_text() == render(), "run: .venv/bin/python -m gateway.config.reference > docs/configuration.md"


def test_documented_variables_work_without_a_config_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GATEWAY_CONFIG", raising=False)
    env = {
        "LLM_BASE_URL": "http://127.0.0.1:5000/v1",
        "LLM_MODEL": "m-from-env",
        "LLM_CONTEXT_WINDOW": "16384",
        "LLM_API_KEY": "sk-1",
        "TELEGRAM_BOT_TOKEN": "123:abc",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
    }
    config = load_config(env=env)
    assert (config.llm.base_url, config.llm.model, config.llm.context_window) == (
        "http://127.0.0.1:5000/v1", "m-from-env", 16384
    )
    assert config.llm.api_key == "sk-1" and config.telegram.enabled
    assert config.telemetry.traces_url == "http://127.0.0.1:4318/v1/traces"


def test_a_value_the_file_sets_is_not_replaced_by_the_default_variable(tmp_path):
    path = write(tmp_path, "llm:\n  model: from-file\n")
    assert load_config(path, env={"LLM_MODEL": "from-env"}).llm.model == "from-file"


def test_telemetry_settings_are_checked_and_their_secrets_masked(tmp_path):
    from gateway.config.redaction import redacted_config

    path = write(tmp_path, "telemetry:\n  otlp_endpoint: collector:4318\n")
    with pytest.raises(ConfigError, match=r"telemetry\.otlp_endpoint: .*http:// or https://"):
        load_config(path, env={})
    path = write(tmp_path, "telemetry:\n  max_queue: 10\n  max_batch: 20\n")
    with pytest.raises(ConfigError, match=r"telemetry\.max_batch: .*must not exceed max_queue"):
        load_config(path, env={})
    path = write(
        tmp_path,
        "telemetry:\n  otlp_endpoint: https://u:pw@otel.example/v1/traces\n"
        "  otlp_headers: {Authorization: 'Bearer ${OTLP_TOKEN}'}\n",
    )
    config = load_config(path, env={"OTLP_TOKEN": "tok-secret-1234"})
    assert config.telemetry.traces_url == "https://u:pw@otel.example/v1/traces"
    shown = redacted_config(config)["telemetry"]
    assert shown["otlp_endpoint"] == "https://••••@otel.example/v1/traces"
    assert shown["otlp_headers"] == {"Authorization": "•••• (set, 22 characters)"}
    assert "tok-secret-1234" not in str(redacted_config(config))
