import pytest
import torch
from core_helpers import t

from postrl.core import backtracking_line_search, conjugate_gradient, flat_grad, flat_params, set_flat_params

A = t([[4.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 2.0]])  # symmetric positive definite
B = t([1.0, 2.0, 3.0])


def test_conjugate_gradient_solves_an_spd_system():
    x = conjugate_gradient(lambda v: A @ v, B)
    torch.testing.assert_close(x, torch.linalg.solve(A, B), atol=1e-10, rtol=0)
    assert x.dtype == torch.float64


def test_conjugate_gradient_first_iteration_by_hand():
    # x1 = alpha b with alpha = b.b / b.Ab = 14 / 50: Ab = [6, 10, 8], b.Ab = 6 + 20 + 24 = 50
    torch.testing.assert_close(conjugate_gradient(lambda v: A @ v, B, iters=1), 0.28 * B)


def test_conjugate_gradient_stops_at_the_residual_tolerance():
    calls = []

    def avp(v):
        calls.append(v)
        return A @ v

    conjugate_gradient(avp, B, iters=50)
    assert len(calls) <= 4  # 3x3 system: converged after 3 products (exact arithmetic), never 50
    assert torch.all(conjugate_gradient(avp, torch.zeros(3, dtype=torch.float64)) == 0)


def loss(x):
    return (x**2).sum()  # f(x) = x^2, gradient 2x


def test_line_search_accepts_the_full_step():
    # from x = 1, step -1: f 1 -> 0, actual 1, expected -grad.step = 2, ratio 0.5 > 0.1
    ok, x_new = backtracking_line_search(loss, t([1.0]), t([-1.0]), 2.0)
    assert ok and x_new.item() == 0.0


def test_line_search_backtracks():
    # step -2 overshoots to x = -1 (no improvement); half step lands on 0: actual 1, expected 4 * 0.5 = 2
    ok, x_new = backtracking_line_search(loss, t([1.0]), t([-2.0]), 4.0)
    assert ok and x_new.item() == 0.0
    # accept_ratio 0.9 with step -1: ratios 1/2, 0.75/1, 0.4375/0.5, then 0.234375/0.25 = 0.9375 at x = 0.875
    ok, x_new = backtracking_line_search(loss, t([1.0]), t([-1.0]), 2.0, accept_ratio=0.9)
    assert ok and x_new.item() == 0.875


def test_line_search_constraint():
    # the full step (to 0) moves too far; the half step (to 0.5) satisfies |x_new - x| <= 0.6
    x = t([1.0])
    ok, x_new = backtracking_line_search(
        loss, x, t([-1.0]), 2.0, constraint=lambda z: (z - x).abs().item() <= 0.6
    )
    assert ok and x_new.item() == 0.5


def test_line_search_rejects_and_returns_the_original_point():
    x = t([1.0])
    ok, x_new = backtracking_line_search(loss, x, t([1.0]), 1.0, max_backtracks=5)  # an ascent step
    assert not ok and x_new is x and x.item() == 1.0


def test_flat_param_helpers_round_trip_and_gradient():
    torch.manual_seed(0)
    net = torch.nn.Linear(2, 1).double()
    unused = torch.nn.Parameter(torch.ones(2, dtype=torch.float64))
    flat = flat_params(net)
    assert flat.shape == (3,) and not flat.requires_grad
    set_flat_params(net, t([1.0, 2.0, 3.0]))
    torch.testing.assert_close(net.weight.detach(), t([[1.0, 2.0]]))
    torch.testing.assert_close(net.bias.detach(), t([3.0]))
    # y = w . x + b at x = [4, 5]: dy/dw = x, dy/db = 1; a parameter y does not use gets zeros
    y = net(t([4.0, 5.0])).sum()
    torch.testing.assert_close(flat_grad(y, [*net.parameters(), unused]), t([4.0, 5.0, 1.0, 0.0, 0.0]))
    with pytest.raises(ValueError, match="3 parameters"):
        set_flat_params(net, t([1.0, 2.0]))
