"""Shard plans: each serving rank's pieces tile its shards, every element is published once by
one DP rank, a tensor reassembles exactly through the plan (and through the codec), the DP
split is balanced, and layouts that do not divide are refused."""

from __future__ import annotations

import itertools
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from loom.core.errors import ConfigError
from loom.perf import model_spec
from loom.state.weights import (
    Box,
    ParamSpec,
    ServeLayout,
    ShardRule,
    TrainLayout,
    TrainRank,
    TransferPlan,
    apply,
    decoder_params,
    encode,
    encoded_nbytes,
    infer_rule,
    model_params,
    plan_transfer,
    shard_box,
    stage_layers,
)

# --- factories ------------------------------------------------------------------------------


@st.composite
def tiny_models(draw: st.DrawFn) -> tuple[ParamSpec, ...]:
    kv = draw(st.sampled_from([1, 2, 4]))
    return decoder_params(
        num_layers=draw(st.integers(1, 4)),
        hidden_size=draw(st.sampled_from([2, 4, 6, 8])),
        num_heads=kv * draw(st.sampled_from([1, 2])),
        num_kv_heads=kv,
        head_dim=draw(st.sampled_from([1, 2, 3])),
        intermediate_size=draw(st.sampled_from([2, 4, 6, 8, 12])),
        vocab_size=draw(st.sampled_from([4, 6, 8, 16])),
        qk_norm=draw(st.booleans()),
        qkv_bias=draw(st.booleans()),
    )


layouts = st.tuples(
    st.sampled_from([1, 2, 3, 4]),  # train tp
    st.integers(1, 4),  # pp
    st.integers(1, 3),  # dp
    st.sampled_from([1, 2, 3, 4]),  # serve tp
    st.sampled_from([None, 1, 8, 24]),  # max_piece_bytes
)


def divides(params: tuple[ParamSpec, ...], *tps: int) -> bool:
    return all(p.rule.dim is None or p.shape[p.rule.dim] % tp == 0 for p in params for tp in tps)


Layout = tuple[int, int, int, int, int | None]


@st.composite
def valid_cases(draw: st.DrawFn) -> tuple[tuple[ParamSpec, ...], Layout]:
    """A model and a layout that fits it, drawn so (never drawn and thrown away): TP degrees
    among those that split every sharded dimension, no more stages than layers."""
    params = draw(tiny_models())
    tps = [tp for tp in (1, 2, 3, 4) if divides(params, tp)]
    num_layers = 1 + max(p.layer for p in params if p.layer is not None)
    layout = (
        draw(st.sampled_from(tps)),
        draw(st.integers(1, num_layers)),
        draw(st.integers(1, 3)),
        draw(st.sampled_from(tps)),
        draw(st.sampled_from([None, 1, 8, 24])),
    )
    return params, layout


def stage_of(plan: TransferPlan) -> dict[str, int]:
    """Brute force: layer ranges per stage, embedding first, the rest outside layers last."""
    pp = plan.train.pp
    num_layers = 1 + max(p.layer for p in plan.params if p.layer is not None)
    by_layer = {i: s for s, r in enumerate(stage_layers(num_layers, pp)) for i in r}
    return {
        p.name: by_layer[p.layer] if p.layer is not None else (0 if "embed" in p.name else pp - 1)
        for p in plan.params
    }


def random_tensors(params: tuple[ParamSpec, ...], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {p.name: rng.integers(0, 0x10000, p.shape, dtype=np.uint16) for p in params}


def training_shards(
    plan: TransferPlan, full: dict[str, np.ndarray]
) -> dict[tuple[int, int], dict[str, np.ndarray]]:
    """What each (pp, tp) rank holds: its stage's params, its TP shard of each."""
    stages = stage_of(plan)
    return {
        (pp, tp): {
            p.name: full[p.name][shard_box(p, plan.train.tp, tp).slices].copy()
            for p in plan.params
            if stages[p.name] == pp
        }
        for pp in range(plan.train.pp)
        for tp in range(plan.train.tp)
    }


def reassemble(plan: TransferPlan, full: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """Each serving rank's shards, built only from the pieces the plan routes to it."""
    held = training_shards(plan, full)
    out = []
    for r in range(plan.serve.tp):
        mine = {
            p.name: np.full(shard_box(p, plan.serve.tp, r).shape, 0xDEAD, np.uint16)
            for p in plan.params
        }
        for f in plan.fetches_for(r):
            src = held[(f.piece.src.pp, f.piece.src.tp)][f.piece.param.name]
            mine[f.piece.param.name][f.dst_box.slices] = src[f.piece.src_box.slices]
        out.append(mine)
    return out


def assert_tiles(boxes: list[Box], shape: tuple[int, ...], what: str) -> None:
    cover = np.zeros(shape, np.int64)
    for box in boxes:
        assert all(0 <= lo <= hi <= n for lo, hi, n in zip(box.lo, box.hi, shape, strict=True))
        cover[box.slices] += 1
    assert (cover == 1).all(), f"{what}: gaps or overlaps"


# --- properties -----------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(tiny_models(), layouts)
def test_layouts_that_do_not_fit_are_refused_saying_why(
    params: tuple[ParamSpec, ...], layout: Layout
) -> None:
    t_tp, pp, dp, s_tp, max_piece = layout
    num_layers = 1 + max(p.layer for p in params if p.layer is not None)
    train, serve = TrainLayout(tp=t_tp, pp=pp, dp=dp), ServeLayout(tp=s_tp)
    fits = divides(params, t_tp, s_tp) and pp <= num_layers
    event("fits" if fits else "refused")
    if fits:
        assert plan_transfer(params, train, serve, max_piece_bytes=max_piece).params == params
    else:
        with pytest.raises(ConfigError, match=r"does not split evenly|decoder layers"):
            plan_transfer(params, train, serve, max_piece_bytes=max_piece)


@settings(max_examples=200, deadline=None)
@given(valid_cases(), st.integers(0, 2**32 - 1))
def test_plans_tile_shards_publish_once_and_reassemble_exactly(
    case: tuple[tuple[ParamSpec, ...], Layout], seed: int
) -> None:
    params, (t_tp, pp, dp, s_tp, max_piece) = case
    train, serve = TrainLayout(tp=t_tp, pp=pp, dp=dp), ServeLayout(tp=s_tp)
    plan = plan_transfer(params, train, serve, max_piece_bytes=max_piece)
    stages = stage_of(plan)
    for r in range(s_tp):  # each serving rank's pieces tile exactly its own shards
        for p in params:
            boxes = [f.dst_box for f in plan.fetches_for(r) if f.piece.param == p]
            assert_tiles(boxes, shard_box(p, s_tp, r).shape, f"serve rank {r}, {p.name}")
    for p in params:  # every element published exactly once, by a rank that holds it
        pieces = [x for x in plan.pieces if x.param == p]
        assert_tiles([x.box for x in pieces], p.shape, f"published {p.name}")
        for x in pieces:
            held = shard_box(p, t_tp, x.src.tp)
            assert x.src.pp == stages[p.name]
            assert x.src_box == x.box.shifted(held.lo)
            assert _inside(x.src_box.lo, Box.full(held.shape)), "source box inside the shard"
            assert all(hi <= n for hi, n in zip(x.src_box.hi, held.shape, strict=True))
    full = random_tensors(params, seed)
    for r, got in enumerate(reassemble(plan, full)):
        for p in params:
            assert np.array_equal(got[p.name], full[p.name][shard_box(p, s_tp, r).slices])
    if max_piece is not None:
        for x in plan.pieces:
            row = 2 * x.numel // x.box.shape[0]
            assert x.numel * 2 <= max(max_piece, row), "pieces are cut to max_piece_bytes"


@settings(max_examples=100, deadline=None)
@given(valid_cases())
def test_dp_ranks_split_each_shard_evenly_up_to_one_piece(
    case: tuple[tuple[ParamSpec, ...], Layout],
) -> None:
    params, (t_tp, pp, dp, s_tp, max_piece) = case
    plan = plan_transfer(
        params, TrainLayout(tp=t_tp, pp=pp, dp=dp), ServeLayout(tp=s_tp), max_piece_bytes=max_piece
    )
    sent = plan.sent_bytes()
    largest = defaultdict(int)
    for x in plan.pieces:
        largest[x.src.pp] = max(largest[x.src.pp], x.nbytes())
    for pp_, tp_ in itertools.product(range(pp), range(t_tp)):
        loads = [sent[TrainRank(dp=d, pp=pp_, tp=tp_)] for d in range(dp)]
        assert max(loads) - min(loads) <= largest[pp_], "greedy LPT bound"
    total = sum(x.nbytes() for x in plan.pieces)
    assert sum(sent.values()) == total
    assert sum(plan.pulled_bytes().values()) == sum(
        f.piece.nbytes() for r in range(s_tp) for f in plan.fetches_for(r)
    )


# --- brute force ----------------------------------------------------------------------------


def test_every_element_routes_as_brute_force_ownership_says() -> None:
    """Per element of every parameter: the training TP rank that holds it, the serving ranks
    that need it and where, computed one element at a time, match the plan."""
    params = decoder_params(
        num_layers=2,
        hidden_size=4,
        num_heads=4,
        num_kv_heads=4,
        head_dim=1,
        intermediate_size=8,
        vocab_size=8,
        qkv_bias=True,
        qk_norm=True,
    )
    for t_tp, s_tp, pp, dp in itertools.product([1, 2, 4], [1, 2, 4], [1, 2], [1, 2]):
        plan = plan_transfer(params, TrainLayout(tp=t_tp, pp=pp, dp=dp), ServeLayout(tp=s_tp))
        for p in params:
            d = p.rule.dim
            for idx in np.ndindex(*p.shape):
                owner = None if d is None else idx[d] // (p.shape[d] // t_tp)
                needs = (
                    {r: idx for r in range(s_tp)}
                    if d is None
                    else {
                        idx[d] // (p.shape[d] // s_tp): tuple(
                            i - (idx[d] // (p.shape[d] // s_tp)) * (p.shape[d] // s_tp)
                            if k == d
                            else i
                            for k, i in enumerate(idx)
                        )
                    }
                )
                holders = [x for x in plan.pieces if x.param == p and _inside(idx, x.box)]
                assert len(holders) == 1
                piece = holders[0]
                assert owner is None or piece.src.tp == owner
                got = {
                    r: tuple(
                        a + (i - b) for a, i, b in zip(f.dst_box.lo, idx, piece.box.lo, strict=True)
                    )
                    for r in range(s_tp)
                    for f in plan.fetches_for(r)
                    if f.piece is piece
                }
                assert got == needs, (p.name, idx, t_tp, s_tp)


def _inside(idx: tuple[int, ...], box: Box) -> bool:
    return all(lo <= i < hi for i, lo, hi in zip(idx, box.lo, box.hi, strict=True))


def test_lpt_split_is_within_its_bound_of_the_brute_force_optimum() -> None:
    """One stage, one TP rank: the DP split is identical-machine scheduling, where greedy LPT
    is within 4/3 - 1/(3·dp) of the optimal makespan."""
    rng = np.random.default_rng(7)
    for trial in range(30):
        sizes = rng.integers(1, 40, size=int(rng.integers(2, 8)))
        params = [
            ParamSpec(name=f"model.norm{i}.weight", shape=(int(n),), rule=ShardRule.REPLICATED)
            for i, n in enumerate(sizes)
        ]
        dp = 2 + trial % 2
        plan = plan_transfer(params, TrainLayout(dp=dp), ServeLayout())
        makespan = max(plan.sent_bytes().values())
        blob = [p.nbytes + 44 for p in params]  # a 1-d dense blob: 36 + 8 header bytes
        best = min(
            max(sum(b for b, a in zip(blob, who, strict=True) if a == d) for d in range(dp))
            for who in itertools.product(range(dp), repeat=len(blob))
        )
        assert makespan <= (4 / 3 - 1 / (3 * dp)) * best + 1e-9


# --- through the codec ----------------------------------------------------------------------


@pytest.mark.parametrize(("t_tp", "pp", "dp", "s_tp"), [(2, 2, 2, 4), (4, 1, 3, 2), (1, 2, 1, 1)])
def test_a_sparse_update_travels_through_the_plan(t_tp: int, pp: int, dp: int, s_tp: int) -> None:
    """Training ranks encode each piece's delta from views of their shards; serving ranks apply
    it in place to views of theirs; the serving shards end bit-equal to the new weights."""
    params = decoder_params(
        num_layers=2,
        hidden_size=8,
        num_heads=4,
        num_kv_heads=4,
        head_dim=2,
        intermediate_size=16,
        vocab_size=16,
        qk_norm=True,
    )
    plan = plan_transfer(params, TrainLayout(tp=t_tp, pp=pp, dp=dp), ServeLayout(tp=s_tp))
    old = random_tensors(params, 1)
    rng = np.random.default_rng(2)
    new = {k: np.where(rng.random(v.shape) < 0.05, v ^ np.uint16(1), v) for k, v in old.items()}
    before, after = training_shards(plan, old), training_shards(plan, new)
    wire = {}
    for x in plan.pieces:
        held = (x.src.pp, x.src.tp)
        a, b = after[held][x.param.name], before[held][x.param.name]
        wire[x.key] = encode(
            a[x.src_box.slices], old=b[x.src_box.slices], version=4, base_version=3
        )
    for r in range(s_tp):
        mine = {p.name: old[p.name][shard_box(p, s_tp, r).slices].copy() for p in params}
        for f in plan.fetches_for(r):
            view = mine[f.piece.param.name][f.dst_box.slices]
            apply(wire[f.piece.key], view, current_version=3, inplace=True)
        for p in params:
            assert np.array_equal(mine[p.name], new[p.name][shard_box(p, s_tp, r).slices])


# --- real models and rules ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["qwen3-8b", "qwen3-32b", "qwen2.5-7b"])
def test_model_params_match_the_model_card(name: str) -> None:
    params = model_params(name)
    spec = model_spec(name)
    assert sum(p.numel for p in params) == pytest.approx(spec.params_b * 1e9, rel=0.01)
    k = next(p for p in params if p.name == "model.layers.0.self_attn.k_proj.weight")
    assert k.shape == (spec.num_kv_heads * spec.head_dim, spec.hidden_size)  # GQA
    assert k.rule is ShardRule.COLUMN


def test_qwen3_8b_plan_pulls_only_each_serving_shard() -> None:
    params = model_params("qwen3-8b")
    plan = plan_transfer(params, TrainLayout(tp=8, pp=2, dp=2), ServeLayout(tp=4))
    split = sum(p.nbytes for p in params if p.rule is not ShardRule.REPLICATED)
    replicated = sum(p.nbytes for p in params if p.rule is ShardRule.REPLICATED)
    headers = {
        r: sum(
            encoded_nbytes(f.piece.box.shape, None) - 2 * f.piece.numel for f in plan.fetches_for(r)
        )
        for r in range(4)
    }
    for r, pulled in plan.pulled_bytes().items():
        assert pulled == split // 4 + replicated + headers[r]
    sent = plan.sent_bytes()
    assert sum(sent.values()) == sum(p.nbytes for p in params) + sum(
        encoded_nbytes(x.box.shape, None) - 2 * x.numel for x in plan.pieces
    )
    assert max(sent.values()) < 1.01 * min(sent.values()), "16 ranks publish ~1/16 each"
    embed = [x for x in plan.pieces if x.param.name == "model.embed_tokens.weight"]
    head = [x for x in plan.pieces if x.param.name == "lm_head.weight"]
    assert {x.src.pp for x in embed} == {0} and {x.src.pp for x in head} == {1}
    assert embed[0].key == "model.embed_tokens.weight[0:18992,0:4096]"
    sparse = plan.sent_bytes(changed_fraction=0.01)
    assert sum(sparse.values()) < 0.031 * sum(sent.values())
    assert plan.sent_bytes(changed_fraction=0.5) == sent, "above the threshold: dense"


def test_rules_follow_module_type_and_shape() -> None:
    cases = {
        ("model.layers.3.self_attn.q_proj.weight", (8, 4)): ShardRule.COLUMN,
        ("model.layers.3.self_attn.k_proj.bias", (4,)): ShardRule.COLUMN,
        ("model.layers.3.self_attn.o_proj.weight", (4, 8)): ShardRule.ROW,
        ("model.layers.3.self_attn.o_proj.bias", (4,)): ShardRule.REPLICATED,
        ("model.layers.3.mlp.down_proj.weight", (4, 8)): ShardRule.ROW,
        ("model.layers.3.post_attention_layernorm.weight", (4,)): ShardRule.REPLICATED,
        ("model.layers.3.self_attn.q_norm.weight", (2,)): ShardRule.REPLICATED,
        ("model.embed_tokens.weight", (16, 4)): ShardRule.COLUMN,
        ("lm_head.weight", (16, 4)): ShardRule.COLUMN,
        ("model.norm.weight", (4,)): ShardRule.REPLICATED,
    }
    for (name, shape), rule in cases.items():
        assert infer_rule(name, shape) is rule, name
    with pytest.raises(ConfigError, match=r"cannot infer a sharding rule for model\.rotary"):
        infer_rule("model.rotary.inv_freq", (4,))
    with pytest.raises(ConfigError, match="not a 2-d weight"):
        infer_rule("model.layers.0.mlp.down_proj.weight", (4,))


def test_bad_layouts_say_what_is_wrong() -> None:
    params = model_params("qwen3-8b")
    with pytest.raises(
        ConfigError, match=r"embed_tokens\.weight: dim 0 of shape \(151936, 4096\) .* tp=3"
    ):
        plan_transfer(params, TrainLayout(tp=3), ServeLayout(tp=1))
    with pytest.raises(ConfigError, match="pp=40 needs at least 40 decoder layers"):
        plan_transfer(params, TrainLayout(pp=40), ServeLayout())
    with pytest.raises(ConfigError, match=r"TrainLayout.dp must be an int >= 1"):
        TrainLayout(dp=0)
    with pytest.raises(ConfigError, match="appears twice"):
        plan_transfer(params + params[:1], TrainLayout(), ServeLayout())
    plan = plan_transfer(params[:1], TrainLayout(), ServeLayout())
    with pytest.raises(ConfigError, match="changed_fraction"):
        plan.sent_bytes(1.5)
    with pytest.raises(ConfigError, match="serving rank 1 is not in"):
        plan.fetches_for(1)
    with pytest.raises(ConfigError, match="is not a rank of"):
        plan.pieces_from(TrainRank(dp=1, pp=0, tp=0))


def test_stages_split_layers_contiguously() -> None:
    assert stage_layers(36, 2) == (range(0, 18), range(18, 36))
    assert stage_layers(7, 3) == (range(0, 3), range(3, 5), range(5, 7))
