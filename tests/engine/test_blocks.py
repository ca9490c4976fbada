from rag.engine.blocks import BlockManager

from .conftest import make_seq


def test_allocate_and_free_returns_every_block():
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = make_seq("a", list(range(10)))
    new = bm.allocate_slots(seq, 10)
    assert new is not None and len(new) == 3 and seq.block_table == new
    assert bm.num_free_blocks == 5
    bm.free(seq)
    assert bm.num_free_blocks == 8 and seq.block_table == []


def test_no_room_is_a_value_and_changes_nothing():
    bm = BlockManager(num_blocks=2, block_size=4)
    seq = make_seq("a", list(range(12)))
    assert bm.allocate_slots(seq, 12) is None
    assert bm.num_free_blocks == 2 and seq.block_table == []


def test_growth_allocates_only_at_block_boundaries():
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = make_seq("a", list(range(4)))
    bm.allocate_slots(seq, 4)
    seq.num_computed_tokens = 4
    seq.append_token(99)
    assert bm.allocate_slots(seq, 1) == [seq.block_table[1]]
    seq.num_computed_tokens = 5
    seq.append_token(100)
    assert bm.allocate_slots(seq, 1) == []  # still room in the second block


def _run_prefill(bm: BlockManager, seq) -> None:
    hits, n = bm.get_computed_blocks(seq)
    assert bm.allocate_slots(seq, seq.num_tokens - n, hits) is not None
    seq.num_computed_tokens = seq.num_tokens
    bm.cache_full_blocks(seq)


def test_prefix_hit_shares_blocks_with_refcounts():
    bm = BlockManager(num_blocks=16, block_size=4)
    a = make_seq("a", list(range(10)))  # 2 full blocks + 2 tokens
    _run_prefill(bm, a)
    b = make_seq("b", list(range(8)) + [50, 51, 52])
    hits, n = bm.get_computed_blocks(b)
    assert hits == a.block_table[:2] and n == 8
    bm.allocate_slots(b, b.num_tokens - n, hits)
    assert [bm.blocks[i].ref_count for i in hits] == [2, 2]
    bm.free(a)
    assert [bm.blocks[i].ref_count for i in hits] == [1, 1]
    bm.free(b)
    assert bm.num_free_blocks == 16


def test_full_prompt_hit_still_leaves_one_token_to_compute():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = make_seq("a", list(range(8)))
    _run_prefill(bm, a)
    b = make_seq("b", list(range(8)))
    _, n = bm.get_computed_blocks(b)
    assert n == 4  # the last block is recomputed so the last token yields logits


def test_different_prefix_does_not_hit():
    bm = BlockManager(num_blocks=8, block_size=4)
    _run_prefill(bm, make_seq("a", [1, 2, 3, 4, 5, 6, 7, 8, 9]))
    hits, n = bm.get_computed_blocks(make_seq("b", [1, 2, 3, 0, 5, 6, 7, 8, 9]))
    assert hits == [] and n == 0
    # Same second block after a different first block: the hash chain tells them apart.
    hits, n = bm.get_computed_blocks(make_seq("c", [0, 0, 0, 0, 5, 6, 7, 8, 9]))
    assert n == 0


def test_freed_cached_blocks_survive_until_evicted_lru_first():
    bm = BlockManager(num_blocks=4, block_size=4)
    a = make_seq("a", list(range(9)))  # 3 blocks, 2 of them full (cached)
    _run_prefill(bm, a)
    bm.free(a)
    assert bm.num_free_blocks == 4 and bm.num_cached_blocks == 2
    again = make_seq("a2", list(range(9)))
    assert bm.get_computed_blocks(again)[1] == 8  # still cached after free
    # Needing all 4 blocks evicts both cached ones.
    c = make_seq("c", [100 + i for i in range(16)])
    assert bm.allocate_slots(c, 16) is not None
    assert bm.num_cached_blocks == 0 and bm.get_computed_blocks(again)[1] == 0
    bm.free(c)
    assert bm.num_free_blocks == 4


def test_eviction_order_keeps_shared_head():
    bm = BlockManager(num_blocks=4, block_size=2)
    a = make_seq("a", [1, 2, 3, 4, 5])  # blocks [1,2] [3,4] cached, [5] plain
    _run_prefill(bm, a)
    bm.free(a)
    b = make_seq("b", [9, 9, 9, 9, 9])  # needs 3 blocks: 2 plain + 1 evicted
    assert bm.allocate_slots(b, 5) is not None
    # The tail cached block [3,4] went first; the head [1,2] is still a hit.
    assert bm.get_computed_blocks(make_seq("c", [1, 2, 3, 4, 5]))[1] == 2


def test_hit_on_evictable_block_counts_against_free_space():
    bm = BlockManager(num_blocks=3, block_size=2)
    a = make_seq("a", [1, 2, 3])
    _run_prefill(bm, a)
    bm.free(a)
    b = make_seq("b", [1, 2, 7, 8, 9, 10])
    hits, n = bm.get_computed_blocks(b)
    assert n == 2
    # 1 hit (from the free pool) + 2 new blocks = 3 = everything: fits exactly.
    assert bm.allocate_slots(b, b.num_tokens - n, hits) is not None
    assert bm.num_free_blocks == 0
    bm.free(b)
    assert bm.num_free_blocks == 3


def test_prefix_blocks_are_shared_within_a_salt_only():
    """Two tenants sending the same prompt share no cached block (each tenant's chain starts
    from its own salt), while one tenant's repeat hits its own."""
    bm = BlockManager(num_blocks=16, block_size=4)
    tokens = list(range(13))

    def run(salt):
        seq = make_seq(salt, tokens, cache_salt=salt)
        hits, n = bm.get_computed_blocks(seq)
        assert bm.allocate_slots(seq, len(tokens) - n, hits) is not None
        seq.num_computed_tokens = len(tokens)
        bm.cache_full_blocks(seq)
        bm.free(seq)
        return n

    assert run("tenant-a") == 0
    assert run("tenant-b") == 0  # the same tokens, another tenant: nothing shared
    assert run("tenant-a") == 12  # its own repeat: three full blocks
