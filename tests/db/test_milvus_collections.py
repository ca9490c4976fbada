"""Milvus bindings (rag.db.milvus_collections): one build at a time, a swap that names the
collection it replaces, a watermark that only moves forward, and one writer."""

from __future__ import annotations

from sqlalchemy import update

from rag.db import Database, collections
from rag.db import milvus_collections as bindings
from rag.db.models import MilvusCollection
from tests.db.conftest import Make


def test_one_build_at_a_time_until_it_goes_stale_and_a_swap_names_the_old(
    db: Database, make: Make
) -> None:
    cid = make.collection(make.tenant())
    with db.write() as s:
        assert bindings.claim_build(s, cid, "gen1", stale_after_s=600) is True
        assert bindings.claim_build(s, cid, "gen1b", stale_after_s=600) is False
    with db.read() as s:
        b = bindings.get(s, cid)
        assert b is not None and (b.name, b.building, b.watermark) == (None, "gen1", 0)
    with db.write() as s:
        assert bindings.finish_build(s, cid, "gen1", {"m": 8}, 5) is None  # nothing replaced
        assert bindings.claim_build(s, cid, "gen2", stale_after_s=600) is True
        bindings.abandon_build(s, cid, "other")  # not the build under way: no effect
    with db.read() as s:
        b = bindings.get(s, cid)
        assert b is not None and (b.name, b.params, b.watermark, b.building) == (
            "gen1", {"m": 8}, 5, "gen2"
        )  # fmt: skip
    with db.write() as s:  # the build's worker died long ago
        s.execute(
            update(MilvusCollection)
            .where(MilvusCollection.collection_id == cid)
            .values(build_started_at=1.0)
        )
        assert bindings.claim_build(s, cid, "gen3", stale_after_s=600) is True
        assert bindings.finish_build(s, cid, "gen3", {}, 9) == "gen1"
        assert bindings.finish_build(s, "no-binding", "genX", {}, 0) == "genX"  # drop it
    with db.read() as s:
        b = bindings.get(s, cid)
        assert b is not None and (b.name, b.watermark, b.building) == ("gen3", 9, None)
        assert bindings.get(s, "no-binding") is None


def test_the_watermark_moves_only_from_where_the_writer_read_it(db: Database, make: Make) -> None:
    cid = make.collection(make.tenant())
    with db.write() as s:
        bindings.claim_build(s, cid, "gen1", 600)
        bindings.finish_build(s, cid, "gen1", {}, 10)
    with db.write() as s:
        assert bindings.advance(s, cid, "gen1", 10, 20) is True
        assert bindings.advance(s, cid, "gen1", 10, 15) is False  # another writer moved it
        assert bindings.advance(s, cid, "old-gen", 20, 30) is False  # swapped out
    with db.read() as s:
        b = bindings.get(s, cid)
        assert b is not None and b.watermark == 20


def test_a_binding_outlives_its_collection_until_removed(db: Database, make: Make) -> None:
    tenant = make.tenant()
    cid, kept = make.collection(tenant), make.collection(tenant)
    with db.write() as s:
        for c in (cid, kept, "purged-long-ago"):
            bindings.claim_build(s, c, f"gen-{c}", 600)
        collections.delete(s, tenant, cid)
    with db.read() as s:
        assert sorted(b.collection_id for b in bindings.orphans(s)) == sorted(
            [cid, "purged-long-ago"]
        )
    with db.write() as s:
        removed = bindings.remove(s, cid)
        assert removed is not None and removed.building == f"gen-{cid}"
        assert bindings.remove(s, cid) is None
    with db.read() as s:
        assert [b.collection_id for b in bindings.orphans(s)] == ["purged-long-ago"]


def test_one_writer_at_a_time_and_its_watermark_is_kept(db: Database, make: Make) -> None:
    cid = make.collection(make.tenant())
    with db.write() as s:
        bindings.claim_build(s, cid, "gen1", 600)
        bindings.finish_build(s, cid, "gen1", {}, 3)
    with bindings.writer(db, cid, wait=False) as w:
        assert w.held and w.binding is not None and w.binding.watermark == 3
        with bindings.writer(db, cid, wait=False) as second:
            assert not second.held and second.binding is None
        assert w.advance("gen1", 3, 7) is True
    with bindings.writer(db, cid, wait=True) as w:
        assert w.held and w.binding is not None and w.binding.watermark == 7
        assert w.swap("gen2", {"m": 4}, 7) == "gen1"
    with db.read() as s:
        b = bindings.get(s, cid)
        assert b is not None and (b.name, b.params, b.watermark) == ("gen2", {"m": 4}, 7)
