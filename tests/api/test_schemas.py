"""Response bodies built from the domain's objects: a field added to one shows in the other."""

from __future__ import annotations

from dataclasses import fields

from rag.api.schemas_search import PassageOut, TuningOut
from rag.ops.tune import Point, TuneReport
from rag.retrieve import Passage


def test_a_passage_out_carries_every_field_of_the_passage_but_its_row_id() -> None:
    p = Passage(7, "doc", "a.txt", 2, "text", 0, 4, 0.9, 0.8, None, {"lang": "en"}, uid="u1")
    out = PassageOut.of(p)
    assert out.chunk_id == "u1" and "uid" not in PassageOut.model_fields
    assert set(PassageOut.model_fields) == {f.name for f in fields(Passage)} - {"uid"}
    assert out.model_dump()["metadata"] == {"lang": "en"} and out.filename == "a.txt"


def test_a_stored_tune_report_reads_back_as_the_tuning_body() -> None:
    points = [Point("ef_search", 16, 0.8, 1.0, 2.0), Point("ef_search", 32, 0.95, 1.5, 3.0)]
    report = TuneReport("c1", "hnsw", 5, 30, 0.9, None, points, points[1], applied=True)
    stored = report.as_dict()
    back = TuneReport.from_dict(stored, "c1", "flat")
    assert back.chosen is back.points[1]  # the sweep's own point, as `table` marks it
    out = TuningOut.of(back, {"ef_search": 32})
    assert out.model_dump() == {**stored, "search_defaults": {"ef_search": 32}}
    assert set(TuningOut.model_fields) == {f.name for f in fields(TuneReport)} | {"search_defaults"}
    # A report stored before a field existed reads with that field unmeasured.
    old = TuneReport.from_dict({"points": []}, "c1", "flat")
    assert (old.kind, old.k, old.chosen, old.measured_at) == ("flat", 10, None, None)
