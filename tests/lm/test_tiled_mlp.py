"""Token-tiled MLP blocks (`postrl.lm.tiled_mlp`, run.memory.mlp_tile_tokens): the same outputs and gradients as
the block itself (float64), with checkpointing and LoRA too; a tiled block saves only its input for the
backward; the state dict and a deep copy are unchanged; a run with it trains as one without."""

from __future__ import annotations

import copy

import pytest
import torch

from postrl.lm.memory import MemoryConfig, configure_memory
from postrl.lm.models import load_causal_lm
from postrl.lm.rollout.forwards import response_forward
from postrl.lm.tiled_mlp import TiledForward, tile_mlps, tiled


def _loss_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids).logits
    loss = (logits.log_softmax(-1)[..., 0] * torch.linspace(-1, 1, logits.shape[1], dtype=logits.dtype)).sum()
    loss.backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("rows", [1, 3, 7, 1000])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_tiled_model_has_the_outputs_and_gradients_of_the_plain_one(tiny_lm_dir, rows, checkpointing):
    plain = load_causal_lm(tiny_lm_dir).double().train()
    tiled_model = copy.deepcopy(plain)
    assert tile_mlps(tiled_model, rows) == plain.config.num_hidden_layers and tiled(tiled_model)
    if checkpointing:
        configure_memory(tiled_model, MemoryConfig(gradient_checkpointing=True))
    ids = torch.randint(3, plain.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    out_a, grads_a = _loss_and_grads(plain, ids)
    out_b, grads_b = _loss_and_grads(tiled_model, ids)
    torch.testing.assert_close(out_b, out_a, rtol=0, atol=1e-12)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-10, atol=1e-12, msg=name)


def test_only_the_input_is_saved_and_the_model_saves_and_copies_as_before(tiny_lm_dir):
    model = load_causal_lm(tiny_lm_dir).train()
    keys = list(model.state_dict())
    configure_memory(model, MemoryConfig(mlp_tile_tokens=4))
    assert list(model.state_dict()) == keys  # nothing registered: save_pretrained writes the same names
    mlp = model.model.layers[0].mlp
    x = torch.randn(2, 5, model.config.hidden_size, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        out = mlp(x)  # what the forward keeps for the backward
    assert saved == [x.shape]  # the block's input only, not its [tokens, intermediate] tensors
    out.sum().backward()
    assert x.grad is not None and mlp.gate_proj.weight.grad is not None
    twin = copy.deepcopy(model)  # e.g. the generation lane's sampler copy
    block = twin.model.layers[0].mlp
    assert isinstance(block.forward, TiledForward) and block.forward.module is block
    with torch.no_grad():  # without gradients the block runs as it is
        torch.testing.assert_close(block(x), type(block).forward(block, x))


def test_the_fast_training_forward_gives_way_to_tiled_blocks(tiny_lm_dir):
    """postrl's fused forward reads the weights itself (it would not tile); scoring without gradients keeps it."""
    model = load_causal_lm(tiny_lm_dir)
    fast = type(response_forward(model, gradients=True))
    configure_memory(model, MemoryConfig(mlp_tile_tokens=8))
    assert type(response_forward(model, gradients=True)) is not fast
    assert type(response_forward(model, gradients=False)) is type(
        response_forward(load_causal_lm(tiny_lm_dir), gradients=False)
    )


def test_a_grpo_run_with_tiled_blocks_trains_as_one_without(tiny_lm_dir, tmp_path):
    """Checkpointing in both (the same forward path); tiling changes float rounding only. With lanes the
    tiled policy's copy goes to the generation lane (deep copy, then pickled into the spawned process)."""
    from postrl.lm.grpo import run_grpo
    from postrl.lm.grpo.config import LanesConfig
    from tests.lm.resume_check import rows_without_times
    from tests.lm.test_grpo import _config

    memory = {"gradient_checkpointing": True}
    plain = _config(tiny_lm_dir, run={"steps": 2, "memory": MemoryConfig(**memory)})
    tiles = _config(tiny_lm_dir, run={"steps": 2, "memory": MemoryConfig(**memory, mlp_tile_tokens=5)})
    run_grpo(plain, tmp_path / "plain")
    run_grpo(tiles, tmp_path / "tiled")
    a, b = rows_without_times(tmp_path / "plain"), rows_without_times(tmp_path / "tiled")
    assert [r.keys() for r in a] == [r.keys() for r in b]
    for ra, rb in zip(a, b, strict=True):
        for key, value in ra.items():
            assert rb[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    wa = load_causal_lm(tmp_path / "plain" / "model").state_dict()
    wb = load_causal_lm(tmp_path / "tiled" / "model").state_dict()
    for name in wa:
        torch.testing.assert_close(wb[name], wa[name], rtol=1e-4, atol=1e-6, msg=name)
    run_grpo(
        _config(
            tiny_lm_dir,
            run={"steps": 2, "memory": MemoryConfig(mlp_tile_tokens=5)},
            lanes=LanesConfig(True, 1),
        ),
        tmp_path / "lanes",
    )
    assert (tmp_path / "lanes" / "model" / "model.safetensors").is_file()
