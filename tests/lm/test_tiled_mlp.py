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


def _block_run(block, x, dy):
    """(output, ∂L/∂x, ∂L/∂params by name) of one MLP block for L = <block(x), dy>."""
    x = x.clone().requires_grad_(True)
    block.zero_grad(set_to_none=True)
    out = block(x)
    out.backward(dy)
    return out.detach(), x.grad, {n: p.grad for n, p in block.named_parameters()}


def _relative(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_silu_blocks_take_the_buffered_path_with_the_gradients_of_autograd(tiny_lm_dir, dtype, monkeypatch):
    """A SiLU block's tiles run through `_SiluTiles` (gradients by hand, into buffers): the block's own outputs
    and gradients (float64 to 1e-10), and in bfloat16 those of the autograd tiles to its rounding."""
    from postrl.lm import tiled_mlp

    plain = load_causal_lm(tiny_lm_dir).to(dtype).model.layers[0].mlp
    block = copy.deepcopy(plain)
    assert tile_mlps(block, 3) == 1
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 7, plain.gate_proj.in_features, generator=gen).to(dtype)
    dy = torch.randn(2, 7, plain.down_proj.out_features, generator=gen).to(dtype)
    reference = _block_run(plain, x, dy)
    with monkeypatch.context() as m:
        m.setattr(tiled_mlp, "_autograd_backward", None)  # the buffered path, or a TypeError
        buffered = _block_run(block, x, dy)
    with monkeypatch.context() as m:
        m.setattr(tiled_mlp, "_silu_block", lambda module, x: None)  # autograd's tiles
        autograd = _block_run(block, x, dy)
    for got, want in ((buffered, reference), (buffered, autograd)):
        if dtype == torch.float64:
            torch.testing.assert_close(got[0], want[0], rtol=0, atol=1e-12)
            torch.testing.assert_close(got[1], want[1], rtol=1e-10, atol=1e-12)
            for name in want[2]:
                torch.testing.assert_close(got[2][name], want[2][name], rtol=1e-10, atol=1e-12, msg=name)
        else:  # bfloat16: one rounding per product either way, summed over tiles in another order
            assert _relative(got[0], want[0]) < 1e-2 and _relative(got[1], want[1]) < 1e-2
            for name in want[2]:
                assert _relative(got[2][name], want[2][name]) < 1e-2, name


def test_other_blocks_and_frozen_weights_take_autograd_tiles(tiny_lm_dir, monkeypatch):
    """A GELU block is not `_SiluTiles`' (autograd's tiles, the block's gradients); a frozen projection gets
    no gradient on the buffered path; without gradients a batch of more rows than a tile runs tiled."""
    from postrl.lm import tiled_mlp

    plain = load_causal_lm(tiny_lm_dir).double().model.layers[0].mlp
    plain.act_fn = torch.nn.GELU(approximate="tanh")
    block = copy.deepcopy(plain)
    tile_mlps(block, 4)
    assert tiled_mlp._silu_block(block, torch.zeros(1, dtype=torch.float64)) is None
    x = torch.randn(3, 5, plain.gate_proj.in_features, dtype=torch.float64)
    dy = torch.randn(3, 5, plain.down_proj.out_features, dtype=torch.float64)
    want, got = _block_run(plain, x, dy), _block_run(block, x, dy)
    torch.testing.assert_close(got[1], want[1], rtol=1e-10, atol=1e-12)
    for name in want[2]:
        torch.testing.assert_close(got[2][name], want[2][name], rtol=1e-10, atol=1e-12, msg=name)

    silu = load_causal_lm(tiny_lm_dir).double().model.layers[0].mlp
    silu.up_proj.weight.requires_grad_(False)
    frozen = copy.deepcopy(silu)
    tile_mlps(frozen, 4)
    want, got = _block_run(silu, x, dy), _block_run(frozen, x, dy)
    assert got[2]["up_proj.weight"] is None and want[2]["up_proj.weight"] is None
    for name in ("gate_proj.weight", "down_proj.weight"):
        torch.testing.assert_close(got[2][name], want[2][name], rtol=1e-10, atol=1e-12, msg=name)
    torch.testing.assert_close(got[1], want[1], rtol=1e-10, atol=1e-12)

    calls = []
    monkeypatch.setattr(tiled_mlp, "_tiled_output", lambda *a: calls.append(a) or silu(a[1]))
    with torch.no_grad():
        frozen(x)  # 15 rows > 4: tiled
        frozen(x[:1, :4])  # 4 rows: the block as it is
    assert len(calls) == 1


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # peft reads it
def test_lora_wrapped_projections_take_autograd_tiles_with_the_adapters_gradients(tiny_lm_dir):
    """LoRA on the MLP's projections (peft's layers, not plain linear ones): the autograd tiles, the adapters'
    gradients those of the untiled model (float64)."""
    peft = pytest.importorskip("peft")
    from postrl.lm import tiled_mlp

    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["gate_proj", "up_proj", "down_proj"])
    base = load_causal_lm(tiny_lm_dir).double()
    plain = peft.get_peft_model(base, config).train()
    for name, p in plain.named_parameters():
        if "lora_B" in name:  # non-zero B: the adapters change the output and get a gradient through x too
            torch.nn.init.normal_(p, std=0.1, generator=torch.Generator().manual_seed(len(name)))
    tiled_model = copy.deepcopy(plain)
    assert tile_mlps(tiled_model, 3) == base.config.num_hidden_layers
    block = next(m for m in tiled_model.modules() if isinstance(m.__dict__.get("forward"), TiledForward))
    assert tiled_mlp._silu_block(block, torch.zeros(1, dtype=torch.float64)) is None
    ids = torch.randint(3, base.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    out_a, grads_a = _loss_and_grads(plain, ids)
    out_b, grads_b = _loss_and_grads(tiled_model, ids)
    torch.testing.assert_close(out_b, out_a, rtol=0, atol=1e-12)
    assert grads_a.keys() == grads_b.keys() and any("lora_A" in n for n in grads_a)
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-10, atol=1e-12, msg=name)
