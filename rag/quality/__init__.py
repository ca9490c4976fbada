"""Quality you can watch: every answer recorded (off its path), feedback on it, quality
series per collection, question and content drift, unanswered topics.

`Quality` is what the composition root builds: the recorder (a queue and a writer thread),
the watch (the drift loop), and `record`, which the answer routes call with each Final.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from rag.config import QualitySettings
from rag.db import Database
from rag.db.answers import NewAnswer
from rag.quality.record import Recorder, build, new_id
from rag.quality.watch import Watch

if TYPE_CHECKING:
    from rag.answer import AskRequest, Final, Prepared

log = logging.getLogger(__name__)

__all__ = ["Quality"]


class Quality:
    def __init__(self, db: Database, settings: QualitySettings) -> None:
        self.settings = settings
        self.recorder = Recorder(db, settings)
        self.watch = Watch(db, settings)

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    def new_id(self, prep: Prepared) -> str | None:
        """The id an answer of `prep` will be recorded under (None: not recorded)."""
        if not self.enabled or not prep.collection_id:
            return None
        return new_id()

    def record(
        self,
        answer_id: str | None,
        prep: Prepared,
        final: Final,
        req: AskRequest,
        conversation_id: str | None = None,
    ) -> NewAnswer | None:
        """Queue the answer's record; the row (None when not recorded). Never raises, never
        waits: a record that cannot be built or queued is logged and dropped, and the
        answer goes out regardless. `conversation_id`: the stored conversation it is a turn
        of (deleting that erases the record)."""
        if answer_id is None:
            return None
        try:
            row = replace(
                build(answer_id, prep, final, req, self.settings), conversation_id=conversation_id
            )
            self.recorder.record(row)
            return row
        except Exception:
            log.exception("could not record answer %s", answer_id)
            return None

    def start(self) -> None:
        if self.enabled:
            self.recorder.start()
            self.watch.start()

    def close(self) -> None:
        self.watch.close()
        self.recorder.close()
