"""One Settings object, built at startup and passed down as typed sub-models.

Every option can be set from the environment with the prefix ``RAG_`` and ``__`` between
levels, for example ``RAG_DATABASE__URL`` or ``RAG_INGEST__MAX_UPLOAD_MB``. Unknown options
fail at startup. Each section's research and tuning switches sit in its `advanced` group
(``RAG_ASK__ADVANCED__CITE_MASK``); docs/settings.md lists every setting
(``python -m rag.config.docs`` writes its tables).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from rag.config.serving import (
    REMOVED_ASK,
    ApiAdvanced,
    ApiSettings,
    AskAdvanced,
    AskSettings,
    AuthSettings,
    DriftAdvanced,
    DriftSettings,
    MetricsSettings,
    QualityAdvanced,
    QualitySettings,
)
from rag.config.storage import (
    ConversationSettings,
    DatabaseSettings,
    EmbedAdvanced,
    EmbedSettings,
    IndexSettings,
    IngestAdvanced,
    IngestSettings,
    MilvusSettings,
    PurgeSettings,
    QuotaSettings,
    SearchSettings,
)
from rag.engine.config import EngineAdvanced, EngineSettings

__all__ = [
    "REMOVED_ASK",
    "ApiAdvanced",
    "ApiSettings",
    "AskAdvanced",
    "AskSettings",
    "AuthSettings",
    "ConversationSettings",
    "DatabaseSettings",
    "DriftAdvanced",
    "DriftSettings",
    "EmbedAdvanced",
    "EmbedSettings",
    "EngineAdvanced",
    "EngineSettings",
    "IndexSettings",
    "IngestAdvanced",
    "IngestSettings",
    "MetricsSettings",
    "MilvusSettings",
    "PurgeSettings",
    "QualityAdvanced",
    "QualitySettings",
    "QuotaSettings",
    "SearchSettings",
    "Settings",
]


class Settings(BaseSettings):
    # Errors name the option and what is wrong, never its value (secrets among them).
    model_config = SettingsConfigDict(
        env_prefix="RAG_",
        env_nested_delimiter="__",
        extra="forbid",
        env_file=None,
        hide_input_in_errors=True,
    )

    data_dir: Path = Path("./data")
    database: DatabaseSettings = DatabaseSettings()
    embed: EmbedSettings = EmbedSettings()
    ingest: IngestSettings = IngestSettings()
    index: IndexSettings = IndexSettings()
    milvus: MilvusSettings = MilvusSettings()
    search: SearchSettings = SearchSettings()
    purge: PurgeSettings = PurgeSettings()
    quota: QuotaSettings = QuotaSettings()
    conversations: ConversationSettings = ConversationSettings()
    engine: EngineSettings = EngineSettings()
    ask: AskSettings = AskSettings()
    auth: AuthSettings = AuthSettings()
    api: ApiSettings = ApiSettings()
    metrics: MetricsSettings = MetricsSettings()
    quality: QualitySettings = QualitySettings()
    log_level: str = "INFO"
    log_json: bool = False

    @model_validator(mode="after")
    def _overlap_below_size(self) -> Settings:
        if self.ingest.chunk_overlap >= self.ingest.chunk_tokens:
            raise ValueError("ingest.chunk_overlap must be smaller than ingest.chunk_tokens")
        return self

    @property
    def database_url(self) -> str:
        if self.database.url:
            return self.database.url
        return f"sqlite:///{(self.data_dir / 'rag.db').resolve()}"
