"""Settings: research switches live in each section's `advanced` group; a setting moved or
removed in this release is still accepted, with a warning naming where it went."""

from __future__ import annotations

import logging

import pytest
from pydantic import ValidationError

from rag.config import Settings


def _user_settings(model: type, prefix: str = "") -> list[str]:
    out: list[str] = []
    for name, field in model.model_fields.items():
        kind = field.annotation
        if isinstance(kind, type) and hasattr(kind, "model_fields"):
            if name != "advanced":
                out += _user_settings(kind, f"{prefix}{name}.")
        else:
            out.append(prefix + name)
    return out


def test_a_moved_setting_is_read_from_its_old_name_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("RAG_ASK__CITE_STEER", "false")
    monkeypatch.setenv("RAG_EMBED__QUERY_FORMAT", "float32")
    with caplog.at_level(logging.WARNING, logger="rag.deprecated"):
        s = Settings()
    assert s.ask.advanced.cite_steer is False and s.embed.advanced.query_format == "float32"
    assert "RAG_ASK__ADVANCED__CITE_STEER" in caplog.text
    assert "RAG_EMBED__ADVANCED__QUERY_FORMAT" in caplog.text


def test_the_new_name_wins_over_the_old(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAG_ASK__SENTENCE_TOKENS", "12")
    monkeypatch.setenv("RAG_ASK__ADVANCED__SENTENCE_TOKENS", "30")
    assert Settings().ask.advanced.sentence_tokens == 30
    assert Settings(ask={"frequency_penalty": 0.1}).ask.advanced.frequency_penalty == 0.1


def test_a_removed_setting_is_ignored_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("RAG_API__PAGE_SIZE_MAX", "100")
    monkeypatch.setenv("RAG_ASK__ATTRIBUTION", "whole")
    with caplog.at_level(logging.WARNING, logger="rag.deprecated"):
        Settings()
    assert "RAG_API__PAGE_SIZE_MAX" in caplog.text and "RAG_ASK__ATTRIBUTION" in caplog.text


def test_unknown_settings_still_stop_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAG_ASK__CITE_STEEER", "false")
    with pytest.raises(ValidationError, match="cite_steeer"):
        Settings()
    with pytest.raises(ValidationError):
        Settings(ask={"advanced": {"mode": "extractive"}})  # a user setting is not advanced


def test_advanced_groups_hold_no_user_setting() -> None:
    users = set(_user_settings(Settings))
    assert "ask.mode" in users and "api.max_long_polls" in users
    assert not users & {"ask.cite_mask", "engine.weights", "api.thread_queue", "quality.flush_s",
                         "ingest.lease_s"}  # fmt: skip
