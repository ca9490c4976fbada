"""`rag tune` and `rag index rebuild|check|repair` on a real collection."""

from __future__ import annotations

from pathlib import Path

from rag.db.models import Collection
from rag.ops import tune
from tests.conftest import Api

WORDS = (
    "harbour ferry tide keeper lens ship storm light coast chart rope sail anchor "
    "dock pier wave gull buoy mast hull deck cabin oar net"
).split()


def _fill(api: Api, n: int = 120) -> str:
    import random

    rng = random.Random(3)
    cid = api.collection(api.a, index={"kind": "hnsw", "params": {"m": 8}})
    jobs = []
    for i in range(n):
        text = " ".join(rng.choice(WORDS) for _ in range(40)) + f" entry {i}"
        jobs.append(api.upload_text(api.a, cid, text)["job_id"])
    for job in jobs:
        assert api.wait_job(api.a, job)["state"] == "done"
    return cid


def test_tune_measures_a_sweep_and_applies_the_cheapest_setting(
    sqlite_api: Api, tmp_path: Path
) -> None:
    api = sqlite_api
    cid = _fill(api)
    report = tune.tune(api.services, cid, n_queries=30, k=5, target_recall=0.9, apply=True)
    assert report.kind == "hnsw"
    values = [p.value for p in report.points]
    assert values == sorted(values) and len(values) >= 5
    assert all(0.0 <= p.recall <= 1.0 and p.p99_ms >= p.p50_ms > 0 for p in report.points)
    assert report.points[-1].recall >= 0.9  # a wide enough beam finds the exact answers
    chosen = report.chosen
    assert chosen is not None and chosen.recall >= 0.9
    # The cheapest: no smaller setting meets the target.
    assert all(p.recall < 0.9 for p in report.points if (p.value or 0) < (chosen.value or 0))
    with api.services.db.read() as s:
        row = s.get(Collection, cid)
        assert row is not None
        assert row.search_defaults["ef_search"] == chosen.value
        assert row.tuning is not None and len(row.tuning["points"]) == len(report.points)
    # Searches now use the stored default.
    out = api.client.post(
        f"/v1/collections/{cid}/search", json={"query": "ferry", "k": 5}, headers=api.a
    ).json()
    assert out["knobs"]["ef_search"] == chosen.value
    png = tune.draw(report, tmp_path / "curve.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "chosen" in report.table()


def test_pareto_front() -> None:
    P = tune.Point
    pts = [
        P("ef_search", 10, 0.8, 1, 2),
        P("ef_search", 20, 0.9, 1, 3),
        P("ef_search", 40, 0.85, 1, 4),
        P("ef_search", 80, 0.99, 1, 5),
    ]
    assert [p.value for p in tune.pareto(pts)] == [10, 20, 80]
    assert tune.choose(pts, 0.9, None).value == 20  # type: ignore[union-attr]
    assert tune.choose(pts, 0.95, 4.0) is None


def _cli_env(api: Api, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    settings = api.services.settings
    monkeypatch.setenv("RAG_DATA_DIR", str(settings.data_dir))
    monkeypatch.setenv("RAG_DATABASE__URL", settings.database_url)
    monkeypatch.setenv("RAG_EMBED__BACKEND", "hash")
    monkeypatch.setenv("RAG_AUTH__ADMIN_KEY", "test-admin-key-0123456789")


def test_rag_index_rebuild_cli(sqlite_api: Api, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    from rag.cli import main

    api = sqlite_api
    cid = _fill(api, 30)
    settings = api.services.settings
    _cli_env(api, monkeypatch)
    assert main(["index", "rebuild", cid, "--kind", "faiss_flat"]) == 0
    captured = capsys.readouterr()
    assert f"rebuilt {cid}: faiss_flat, 30 vectors" in captured.out
    assert "rebuild: 100%" in captured.err and "30/30" in captured.err  # the progress bar
    with api.services.db.read() as s:
        row = s.get(Collection, cid)
        assert row is not None and row.index_kind == "faiss_flat"
    gens = list((settings.data_dir / "indexes" / cid).glob("gen-*"))
    assert gens, "the rebuild wrote a snapshot generation"


def test_rag_tune_cli_shows_progress(sqlite_api: Api, monkeypatch, capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from rag.cli import main

    api = sqlite_api
    cid = _fill(api, 30)
    _cli_env(api, monkeypatch)
    png = tmp_path / "curve.png"
    code = main(["tune", cid, "-n", "10", "--k", "5", "--target-recall", "0.5", "--png", str(png)])
    captured = capsys.readouterr()
    assert code == 0, captured.out
    assert "cheapest meeting the target" in captured.out and png.exists()
    assert "tune: 100%" in captured.err  # one tick per setting of the sweep


def test_rag_index_check_and_repair_cli(sqlite_api: Api, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    from rag.cli import main

    api = sqlite_api
    cid = _fill(api, 6)
    _cli_env(api, monkeypatch)
    # A snapshot that lost a vector, as one written after an id was reused did.
    index = api.services.indexes.get(cid)
    lost = int(index.ids()[0])
    index.erase(index.ids()[:1])
    api.services.indexes.snapshot(cid)
    assert main(["index", "check"]) == 1
    out = capsys.readouterr().out
    assert f"{cid} hnsw: index 5, sql 6, missing 1, extra 0: MISMATCH" in out
    assert f"missing e.g. [{lost}]" in out
    assert main(["index", "repair", cid]) == 0
    assert "repaired" in capsys.readouterr().out
    assert main(["index", "check", cid]) == 0
    assert f"{cid} hnsw: index 6, sql 6, missing 0, extra 0: ok" in capsys.readouterr().out
