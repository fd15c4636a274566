"""Training loop, attention regressor and the differentiable Monte Carlo objective."""

from __future__ import annotations

import math

import pytest
import torch

from nwlib import hdi, make_task, nadaraya_watson_weights, principal_angles
from nwlib.models.training import (
    AttentionRegressor,
    InContextTask,
    ensemble_mse,
    head_correlation,
    optimise_subspaces,
    orthogonality_penalty,
    orthonormal_heads,
    train_regressor,
)


def test_task_function_and_sampling():
    task = InContextTask(embed_dim=5, signal_dim=2, frequency=1.5, noise_sd=0.0)
    x = torch.randn(7, 5, dtype=torch.float64)
    torch.testing.assert_close(task.f(x), (torch.sin(1.5 * x[:, 0]) + torch.sin(1.5 * x[:, 1])) / math.sqrt(2))
    p = task.sample(3, 10, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert p.x_context.shape == (3, 10, 5) and p.y_query.shape == (3, 4)
    torch.testing.assert_close(p.y_context, task.f(p.x_context))  # noise_sd = 0
    torch.testing.assert_close(p.f_query, task.f(p.x_query))
    q = task.sample(3, 10, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert torch.equal(p.x_query, q.x_query)


def test_regressor_is_a_weighted_sum_of_nw_heads(dtype, tol):
    # Reference: head by head, softmax weights over the context, values y, weights alpha_h.
    g = torch.Generator().manual_seed(1)
    model = AttentionRegressor(6, 3, generator=g, dtype=dtype)
    with torch.no_grad():
        model.attention.in_proj_bias.normal_(generator=g)
        model.attention.out_proj.bias.normal_(generator=g)
        model.readout.bias.fill_(0.3)
    task = InContextTask(embed_dim=6, signal_dim=6)
    p = task.sample(2, 9, 4, generator=g, dtype=dtype)
    a = model.attention
    d_k = 2
    b_q, b_k, b_v = a.in_proj_bias.chunk(3)
    r = model.readout.weight[0]
    want = torch.zeros(2, 4, dtype=dtype)
    for h in range(3):
        rows = slice(h * d_k, (h + 1) * d_k)
        q = p.x_query @ a.q_proj_weight[rows].T + b_q[rows]
        k = p.x_context @ a.k_proj_weight[rows].T + b_k[rows]
        v = p.y_context[..., None] @ a.v_proj_weight[rows].T + b_v[rows]
        w = torch.softmax(q @ k.mT / math.sqrt(d_k), dim=-1)
        want = want + (w @ v) @ a.out_proj.weight[:, rows].T @ r
    want = want + a.out_proj.bias @ r + model.readout.bias
    with torch.no_grad():
        got = model(p.x_context, p.y_context, p.x_query)
        contrib = model.head_contributions(p.x_context, p.y_context, p.x_query)
    torch.testing.assert_close(got, want.detach(), **tol)
    torch.testing.assert_close(contrib.sum(1) + a.out_proj.bias @ r + model.readout.bias, got, **tol)
    # with zero value biases each contribution is alpha_h times head h's NW estimate of y
    with torch.no_grad():
        a.in_proj_bias.zero_()
        nw = torch.stack(
            [
                nadaraya_watson_weights(
                    p.x_query @ a.q_proj_weight[h * 2 : (h + 1) * 2].T,
                    p.x_context @ a.k_proj_weight[h * 2 : (h + 1) * 2].T,
                )
                @ p.y_context[..., None]
                for h in range(3)
            ],
            dim=1,
        )[..., 0]
        contrib = model.head_contributions(p.x_context, p.y_context, p.x_query)
    torch.testing.assert_close(contrib, model.head_weights().detach()[None, :, None] * nw, **tol)


def test_orthogonality_penalty_matches_explicit_sums():
    g = torch.Generator().manual_seed(2)
    W = torch.randn(4, 10, 3, generator=g, dtype=torch.float64)
    cos2 = sum(torch.cos(principal_angles(W[h], W[k])).pow(2).sum() for h in range(4) for k in range(h + 1, 4))
    torch.testing.assert_close(orthogonality_penalty(W), cos2)
    torch.testing.assert_close(orthogonality_penalty(W), 6 * 3 * (1 - hdi(W)))
    gram = sum((W[h].T @ W[k]).pow(2).sum() for h in range(4) for k in range(h + 1, 4))
    torch.testing.assert_close(orthogonality_penalty(W, kind="gram"), gram)
    with pytest.raises(ValueError, match="kind"):
        orthogonality_penalty(W, kind="paper")
    with pytest.raises(ValueError, match="two heads"):
        orthogonality_penalty(W[:1])


def test_orthonormal_heads_keep_the_shared_block_and_carry_gradients():
    g = torch.Generator().manual_seed(3)
    shared = torch.eye(7, dtype=torch.float64)[:, :1]
    free = torch.randn(3, 7, 2, generator=g, dtype=torch.float64, requires_grad=True)
    Q = orthonormal_heads(free, shared)
    assert Q.shape == (3, 7, 3)
    torch.testing.assert_close(Q.mT @ Q, torch.eye(3, dtype=torch.float64).expand(3, 3, 3))
    torch.testing.assert_close(Q[:, :, 0], shared[:, 0].expand(3, 7))
    orthogonality_penalty(Q).backward()
    assert free.grad is not None and bool(torch.isfinite(free.grad).all())
    with pytest.raises(ValueError, match="shared"):
        orthonormal_heads(free, torch.eye(5, dtype=torch.float64)[:, :1])


def test_head_correlation():
    c = torch.randn(5, 3, 8, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    flat = c.transpose(0, 1).reshape(3, -1)
    corr = torch.corrcoef(flat)
    torch.testing.assert_close(head_correlation(c), (corr[0, 1] + corr[0, 2] + corr[1, 2]) / 3)
    assert float(head_correlation(torch.stack([c[:, 0], 2 * c[:, 0] + 1], dim=1))) == pytest.approx(1.0)


def test_training_is_deterministic_learns_and_the_penalty_orthogonalises():
    task = InContextTask(embed_dim=4, signal_dim=1, noise_sd=0.3)
    kwargs = dict(num_heads=2, steps=60, batch_size=16, context=32, queries=8, lr=0.02, eval_every=30, test_prompts=64)
    model, h1 = train_regressor(task, seed=3, **kwargs)
    _, h2 = train_regressor(task, seed=3, **kwargs)
    assert h1 == h2
    assert h1.step == [0, 30, 60] and math.isnan(h1.train_loss[0])
    assert h1.test_mse[-1] < 0.5 * h1.test_mse[0]
    _, hp = train_regressor(task, seed=3, penalty=5.0, **kwargs)
    assert hp.hdi_key[0] == h1.hdi_key[0]  # same initialisation
    assert hp.hdi_key[-1] > 0.99 > h1.hdi_key[-1]
    assert len(h1.head_weights[-1]) == 2
    with pytest.raises(ValueError, match="num_heads"):
        train_regressor(task, num_heads=3, steps=1)
    with pytest.raises(ValueError, match="penalty"):
        train_regressor(task, num_heads=2, steps=1, penalty=-1.0)
    with pytest.raises(TypeError, match="task"):
        train_regressor(make_task("isotropic", 4), num_heads=2, steps=1)


def test_ensemble_mse_matches_explicit_weights_and_has_gradients():
    task = make_task("single_index", 5, noise_sd=0.5)
    g = torch.Generator().manual_seed(5)
    x, y = task.sample((3,), 20, generator=g, dtype=torch.float64)
    z = torch.randn(6, 5, generator=g, dtype=torch.float64)
    W = torch.randn(2, 5, 2, generator=g, dtype=torch.float64, requires_grad=True)
    got = ensemble_mse(W, task, x, y, z, bandwidth=0.7)
    preds = torch.stack(
        [
            torch.stack(
                [
                    nadaraya_watson_weights(z @ W[h], x[r] @ W[h], kernel="gaussian", bandwidth=0.7) @ y[r]
                    for h in range(2)
                ]
            )
            for r in range(3)
        ]
    )  # (R, H, m)
    want = (preds.mean(1) - task.f(z)).pow(2).mean()
    torch.testing.assert_close(got, want)
    assert torch.autograd.gradcheck(lambda w: ensemble_mse(w, task, x, y, z, bandwidth=0.7), (W,))
    with pytest.raises(ValueError, match="shapes"):
        ensemble_mse(W, task, x, y[:, :5], z, bandwidth=0.7)


def test_optimisation_finds_the_signal():
    task = make_task("single_index", 6, noise_sd=0.3)
    Q, hist = optimise_subspaces(
        task,
        num_heads=2,
        head_dim=2,
        n=100,
        steps=80,
        replicates=8,
        eval_size=32,
        bandwidth=0.5,
        lr=0.05,
        seed=1,
        record_every=40,
    )
    assert hist.step == [0, 40, 80]
    torch.testing.assert_close(Q.mT @ Q, torch.eye(2, dtype=torch.float64).expand(2, 2, 2))
    assert hist.signal_overlap[-1] > 0.9 > hist.signal_overlap[0]
    e1 = torch.eye(6, dtype=torch.float64)[:, :1]
    Qs, _ = optimise_subspaces(task, num_heads=2, head_dim=2, n=100, steps=2, bandwidth=0.5, shared=e1)
    torch.testing.assert_close(Qs[:, :, 0], e1[:, 0].expand(2, 6))
    with pytest.raises(ValueError, match="head_dim"):
        optimise_subspaces(task, num_heads=2, head_dim=1, n=10, steps=1, bandwidth=0.5, shared=e1)


def test_early_stopping_returns_the_best_validation_model():
    task = InContextTask(embed_dim=4, signal_dim=1, noise_sd=0.3)
    kwargs = dict(num_heads=2, steps=400, batch_size=8, context=16, queries=4, lr=0.05, eval_every=10, test_prompts=32)
    model, h = train_regressor(task, seed=1, patience=2, **kwargs)
    best = h.best_index
    assert len(h.val_mse) == len(h.step) and 0 <= best < len(h.step)
    # the best evaluation has the lowest validation MSE, and training stopped `patience` evaluations after it
    assert h.val_mse[best] == min(h.val_mse)
    assert h.step[-1] == 400 or len(h.step) - 1 - best == 2
    # the returned model is the one of the best evaluation: recompute its test MSE on the same test prompts
    test = task.sample(32, 16, 4, generator=torch.Generator().manual_seed(1 + 2))
    with torch.no_grad():
        mse = float((model(test.x_context, test.y_context, test.x_query) - test.f_query).pow(2).mean())
    assert mse == pytest.approx(h.test_mse[best], rel=1e-5)
    # the validation set is its own draw (seed + 3): its MSE is against the noisy responses
    val = task.sample(32, 16, 4, generator=torch.Generator().manual_seed(1 + 3))
    with torch.no_grad():
        v = float((model(val.x_context, val.y_context, val.x_query) - val.y_query).pow(2).mean())
    assert v == pytest.approx(h.val_mse[best], rel=1e-5)
    # without patience: every step, the last model
    _, full = train_regressor(task, seed=1, **(kwargs | {"steps": 30}))
    assert full.step == [0, 10, 20, 30] and full.best_index == 3
    with pytest.raises(ValueError, match="patience"):
        train_regressor(task, num_heads=2, steps=1, patience=0)


def test_token_values_regressor_is_wv_of_the_nw_average_of_tokens():
    # Reference: head by head, softmax weights over the context, values W_V^h (x_i, y_i), then W_O and the read-out.
    g = torch.Generator().manual_seed(2)
    model = AttentionRegressor(4, 2, generator=g, dtype=torch.float64, values="token")
    a = model.attention
    assert a.v_proj_weight.shape == (4, 5)
    p = InContextTask(4, 1).sample(3, 6, 2, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    with torch.no_grad():
        got = model(p.x_context, p.y_context, p.x_query)
        tokens = torch.cat([p.x_context, p.y_context.unsqueeze(-1)], dim=-1)  # (B, n, D + 1)
        bq, bk, bv = a.in_proj_bias.chunk(3)
        out = torch.zeros(3, 2, 4, dtype=torch.float64)
        for h in range(2):
            sl = slice(2 * h, 2 * h + 2)
            q = p.x_query @ a.q_proj_weight[sl].T + bq[sl]
            k = p.x_context @ a.k_proj_weight[sl].T + bk[sl]
            w = torch.softmax(q @ k.mT / math.sqrt(2), dim=-1)
            v = tokens @ a.v_proj_weight[sl].T + bv[sl]
            out += (w @ v) @ a.out_proj.weight[:, sl].T
        want = model.readout(out + a.out_proj.bias).squeeze(-1)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(
            model.head_contributions(p.x_context, p.y_context, p.x_query).sum(1) + (model.readout(a.out_proj.bias)), got
        )
    with pytest.raises(ValueError, match="values"):
        AttentionRegressor(4, 2, generator=g, values="keys")
