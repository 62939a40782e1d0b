import torch

from postrl.runtime.distributed import (
    all_reduce_mean,
    init_distributed,
    reduce_metrics,
    shard_range,
    unwrap,
    wrap_ddp,
)


def test_single_process_is_a_no_op(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    info = init_distributed("cpu")
    assert (info.rank, info.world_size, info.is_main) == (0, 1, True)
    t = torch.tensor([1.0, 2.0])
    assert torch.equal(all_reduce_mean(t), t)
    assert reduce_metrics({"a": 1.5}) == {"a": 1.5}
    m = torch.nn.Linear(2, 2)
    assert wrap_ddp(m, info) is m and unwrap(m) is m


def test_shards_cover_everything_once():
    from postrl.runtime.distributed import DistInfo

    for n in (0, 1, 7, 16):
        for w in (1, 2, 3, 5):
            parts = [list(shard_range(n, DistInfo(r, w, r, torch.device("cpu")))) for r in range(w)]
            assert sum(parts, []) == list(range(n))
            assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_micro_batches_keep_ranks_in_step(monkeypatch):
    """Every rank runs the same number of micro-batches (FSDP/DDP collectives stay matched); an empty
    share is one example with weight 0; the real shares cover the step's examples once."""
    from postrl.lm.trainer import micro_batches
    from postrl.runtime import distributed as dist

    for n, world, accum in [(5, 2, 2), (1, 2, 1), (7, 3, 4), (8, 2, 1)]:
        indices = list(range(100, 100 + n))
        per_rank = []
        for r in range(world):
            monkeypatch.setattr(dist, "rank", lambda r=r: r)
            monkeypatch.setattr(dist, "world_size", lambda w=world: w)
            per_rank.append(micro_batches(indices, accum))
        assert len({len(m) for m in per_rank}) == 1
        real = [i for m in per_rank for chunk, w in m if w == 1.0 for i in chunk]
        assert real == indices
        assert all(chunk == [100] for m in per_rank for chunk, w in m if w == 0.0)
