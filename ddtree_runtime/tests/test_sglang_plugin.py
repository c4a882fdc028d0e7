"""The SGLang plugin's pure parts (no SGLang needed): settings, version guards, verify-tensor layouts, TP merge."""

from __future__ import annotations

import importlib.util
import itertools

import pytest
import torch
from ddtree_runtime.sglang import compat, register, registration_error
from ddtree_runtime.sglang.config import (
    MAX_BUDGET,
    REQUIRED_SERVER_ARG_FIELDS,
    DDTreeConfigError,
    required_server_args,
    resolve_settings,
)
from ddtree_runtime.sglang.server_args_rules import refuse_mamba_tracking
from ddtree_runtime.sglang.tree_inputs import (
    accepted_first_order,
    accepted_paths,
    committed_tokens,
    compiled_sglang_verify_inputs,
    local_topk,
    merge_sharded_topk,
    sglang_verify_inputs,
)
from ddtree_runtime.tree import (
    NO_NODE,
    build_tree,
    build_tree_batch,
    build_tree_batch_from_topk,
    build_tree_from_topk,
    depth_log_probs,
)
from ddtree_runtime.verify import follow_greedy, follow_greedy_batch

# ---- settings ------------------------------------------------------------------------------------------------


def test_settings_follow_the_production_flags_and_environment() -> None:
    settings = resolve_settings(16, {"DDTREE_BUDGET": "64", "DDTREE_TOPK": "8"})
    assert (settings.draft_tokens, settings.budget, settings.max_topk, settings.verify_topk) == (16, 64, 8, 2)
    assert (settings.max_depth, settings.verify_width) == (15, 65)
    assert settings.topk_for_vocab(151_936) == 8
    assert settings.topk_for_vocab(5) == 5


def test_settings_defaults_match_the_dflash_chain_width() -> None:
    settings = resolve_settings(None, {})
    assert (settings.draft_tokens, settings.budget, settings.max_topk) == (16, 15, None)
    assert settings.verify_width == 16
    assert settings.topk_for_vocab(1000) == 15


@pytest.mark.parametrize("draft_tokens", [0, 1, 17, 64])
def test_settings_refuse_draft_lengths_outside_the_drafter_block(draft_tokens: int) -> None:
    with pytest.raises(DDTreeConfigError, match=r"2\.\.16"):
        resolve_settings(draft_tokens, {})


def test_the_server_args_ddtree_sets_are_what_a_command_line_leaves_open() -> None:
    settings = resolve_settings(16, {"DDTREE_BUDGET": "64"})
    assert required_server_args({}, settings) == {
        "speculative_num_draft_tokens": 16, "speculative_num_steps": 1, "speculative_eagle_topk": 2,
        "max_running_requests": 48, "page_size": 1, "attention_backend": "triton",
        "speculative_draft_attention_backend": "triton", "linear_attn_verify_backend": "triton"}
    stated = {"speculative_num_draft_tokens": 16, "speculative_num_steps": 1, "speculative_eagle_topk": 2,
              "max_running_requests": 16, "page_size": 1, "attention_backend": "flashinfer",
              "speculative_draft_attention_backend": "flashinfer", "linear_attn_verify_backend": "triton"}
    assert set(stated) == set(REQUIRED_SERVER_ARG_FIELDS)
    assert required_server_args(stated, settings) == {}, "a unit that states them all is served as written"
    # the two DDTREE always decides are overridden; the drafter follows the target's attention backend
    assert required_server_args({"speculative_num_steps": 3, "speculative_eagle_topk": 1,
                                 "attention_backend": "flashinfer"}, settings) == {
        "speculative_num_draft_tokens": 16, "speculative_num_steps": 1, "speculative_eagle_topk": 2,
        "max_running_requests": 48, "page_size": 1, "speculative_draft_attention_backend": "flashinfer",
        "linear_attn_verify_backend": "triton"}


def test_budget_is_capped_at_the_tree_kernels_largest_tree() -> None:
    assert resolve_settings(16, {"DDTREE_BUDGET": str(MAX_BUDGET)}).verify_width == MAX_BUDGET + 1
    with pytest.raises(DDTreeConfigError, match=f"at most {MAX_BUDGET}"):
        resolve_settings(16, {"DDTREE_BUDGET": str(MAX_BUDGET + 1)})


@pytest.mark.parametrize(("draft", "budget", "reservation"),
                         [(16, None, 32), (16, 15, 32), (16, 16, 33), (16, 64, 81), (16, 1024, 1041), (4, 1, 8)])
def test_decode_reservation_covers_the_lagging_commit_and_the_verify_window(
        draft: int, budget: int | None, reservation: int) -> None:
    """DFLASH reserves 2 x D = 32 slots per step: under overlap scheduling round t+1 is planned before round t
    commits (up to min(D, W) tokens), then writes max(D, W) slots. A budget-64 tree needs 16 + 65; with 32 its verify
    would write KV into slots owned by other requests."""
    environ = {} if budget is None else {"DDTREE_BUDGET": str(budget)}
    settings = resolve_settings(draft, environ)
    assert settings.decode_reservation(2 * draft) == reservation
    window = max(settings.verify_width, settings.draft_tokens)
    assert settings.decode_reservation(2 * draft) >= settings.max_committed_per_round + window
    assert settings.decode_reservation(4096) == 4096  # never less than SGLang asked for


@pytest.mark.parametrize(("strategy", "interval", "budget", "refused"), [
    ("extra_buffer", 256, 64, False), ("extra_buffer", 256, 255, False), ("extra_buffer", 256, 256, True),
    ("extra_buffer_lazy", 256, 1024, True), ("extra_buffer", 2048, 1024, False), ("no_buffer", 256, 1024, False),
    ("auto", 256, 1024, False), (None, None, 1024, False), ("extra_buffer", None, 256, True),
    ("extra_buffer", 1280, 1024, False),
])
def test_a_verify_window_may_span_at_most_one_mamba_track_interval(
        strategy: str | None, interval: int | None, budget: int, refused: bool) -> None:
    """The same rule at validation and, on the resolved arguments, at worker start (``auto`` resolves to
    extra_buffer under overlap scheduling after validation)."""
    args = type("Args", (), {"mamba_radix_cache_strategy": strategy, "mamba_track_interval": interval})()
    settings = resolve_settings(16, {"DDTREE_BUDGET": str(budget)})
    if refused:
        track = interval or 256
        with pytest.raises(ValueError, match=f"mamba_track_interval {track} is below the verify width {budget + 1}"
                           f".*pass --mamba-track-interval {-(-(budget + 1) // 256) * 256} .*at most {track - 1}"):
            refuse_mamba_tracking(args, settings)
    else:
        refuse_mamba_tracking(args, settings)


@pytest.mark.parametrize(("budget", "sglang_headroom", "headroom"), [(15, 20, 36), (64, 69, 85), (64, 200, 200)])
def test_req_to_token_rows_hold_a_reservation_made_at_the_context_limit(
        budget: int, sglang_headroom: int, headroom: int) -> None:
    settings = resolve_settings(16, {"DDTREE_BUDGET": str(budget)})
    assert settings.req_to_token_headroom(sglang_headroom) == headroom
    assert settings.req_to_token_headroom(sglang_headroom) >= 4 + settings.decode_reservation(2 * 16)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"DDTREE_BUDGET": "zero"}, "DDTREE_BUDGET must be a positive integer"),
        ({"DDTREE_BUDGET": "0"}, "DDTREE_BUDGET must be a positive integer"),
        ({"DDTREE_TOPK": "-3"}, "DDTREE_TOPK must be a positive integer"),
        ({"DDTREE_VERIFY_TOPK": "1"}, "tree path"),
    ],
)
def test_settings_refuse_malformed_environment(environ: dict[str, str], message: str) -> None:
    with pytest.raises(DDTreeConfigError, match=message):
        resolve_settings(16, environ)


# ---- version guards -------------------------------------------------------------------------------------------


def test_only_the_pinned_release_is_supported() -> None:
    compat.check_version("0.5.23")
    with pytest.raises(compat.UnsupportedSGLang, match="not a release the DDTree plugin supports"):
        compat.check_version("0.5.22")
    with pytest.raises(compat.UnsupportedSGLang, match="too old"):
        compat.check_version("0.5.11")
    with pytest.raises(compat.UnsupportedSGLang, match="not a release"):
        compat.check_version("0.6.0rc1")


def test_version_parsing() -> None:
    assert compat.parse_version("0.5.23") == (0, 5, 23)
    assert compat.parse_version("0.5.23.post1") == (0, 5, 23)
    assert compat.parse_version("0.6.0rc1") == (0, 6, 0)
    assert compat.parse_version("dev") == ()


def test_a_builtin_ddtree_is_never_shadowed() -> None:
    compat.check_no_builtin(["DFLASH", "EAGLE", "NONE"])
    with pytest.raises(compat.UnsupportedSGLang, match="already ships a built-in DDTREE"):
        compat.check_no_builtin(["DFLASH", "DDTree"])


def test_missing_hook_targets_are_named() -> None:
    present = {"a.b.c", "a.b.d"}
    compat.check_targets(["a.b.c", "a.b.d"], resolves=present.__contains__)
    with pytest.raises(compat.UnsupportedSGLang, match=r"x\.y\.z, q\.r"):
        compat.check_targets(["a.b.c", "x.y.z", "q.r"], resolves=present.__contains__)
    assert compat.missing_attributes(["json.dumps", "json.no_such_function", "no_such_module.x"]) == [
        "json.no_such_function", "no_such_module.x"]


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None,
                    reason="this venv has SGLang; tests/contract cover registration there")
def test_register_without_sglang_fails_loudly_and_remembers_why() -> None:
    with pytest.raises(ModuleNotFoundError, match="sglang"):
        register()
    assert isinstance(registration_error(), ModuleNotFoundError)


# ---- verify tensors -------------------------------------------------------------------------------------------


def _trees(seed: int = 0, budgets: tuple[int, ...] = (9, 5, 0)) -> tuple[torch.Tensor, object]:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(budgets), 6, 12, generator=generator) * 2
    return logits, build_tree_batch(logits, list(budgets), max_topk=3)


def test_verify_tensors_have_sglang_full_mask_layout() -> None:
    _unused, trees = _trees()
    roots = torch.tensor([7, 8, 9])
    seq_lens = torch.tensor([5, 3, 11])
    width = 12
    tensors = sglang_verify_inputs(trees, roots, seq_lens, width=width)
    batch = 3
    # SGLang sizes FULL_MASK as sum(seq_lens) * W + W * W * B (eagle_utils / DFlashVerifyInput).
    assert tensors.custom_mask.numel() == int(seq_lens.sum()) * width + width * width * batch
    assert tensors.candidates.shape == (batch, width) and tensors.positions.shape == (batch, width)
    assert bool((tensors.candidates >= 0).all()), "padding must index a real embedding row"
    assert tensors.retrieve_index.tolist() == [[b * width + i for i in range(width)] for b in range(batch)]
    offset = 0
    for b in range(batch):
        tree = trees.tree(b)
        rows = tensors.custom_mask[offset: offset + width * (int(seq_lens[b]) + width)].view(width, -1)
        offset += rows.numel()
        n = tree.num_nodes + 1
        assert bool(rows[:, : int(seq_lens[b])].all()), "every verify token sees the whole prefix"
        assert torch.equal(rows[:n, int(seq_lens[b]): int(seq_lens[b]) + n], tree.visibility)
        assert torch.equal(tensors.positions.view(batch, width)[b, :n], tree.positions(int(seq_lens[b])))
        assert tensors.candidates[b, 0] == roots[b]
        assert torch.equal(tensors.candidates[b, 1:n], tree.token_ids)
        assert bool((tensors.candidates[b, n:] == roots[b]).all())
        assert not bool(tensors.retrieve_next_token[b, n:].ge(0).any()), "padding is never linked"


def round_inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A decode round's top-k arrays (3 requests, depth 15, k 8), bonus tokens and committed lengths."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 15, 40, generator=generator) * 3
    log_probs, ids = depth_log_probs(logits, 8)
    roots = torch.randint(0, 40, (3,), generator=generator)
    seq_lens = torch.randint(1, 30, (3,), generator=generator)
    return log_probs, ids, roots, seq_lens


@pytest.mark.parametrize(("seed", "budget"), [(0, 16), (1, 64), (2, 1), (3, 7)])
def test_compiled_round_tensors_equal_the_pytorch_round(seed: int, budget: int) -> None:
    """The worker's kernel path (here on CPU: ops' reference fallbacks) lays out exactly what its PyTorch path does."""
    log_probs, ids, roots, seq_lens = round_inputs(seed)
    budgets = torch.full((3,), budget, dtype=torch.long)
    expected = sglang_verify_inputs(build_tree_batch_from_topk(log_probs, ids, budgets), roots, seq_lens,
                                    width=budget + 1)
    got = compiled_sglang_verify_inputs(log_probs, ids, roots, seq_lens, seq_lens_sum=int(seq_lens.sum()),
                                        budget=budget)
    for field in ("candidates", "positions", "custom_mask", "retrieve_index", "retrieve_next_token",
                  "retrieve_next_sibling"):
        assert torch.equal(getattr(got, field), getattr(expected, field)), field


def test_padding_to_a_narrower_width_is_refused() -> None:
    _unused, trees = _trees()
    with pytest.raises(ValueError, match="cannot pad"):
        sglang_verify_inputs(trees, torch.tensor([1, 2, 3]), torch.tensor([1, 1, 1]), width=trees.width - 1)


def _sglang_style_accept(
    tensors: object, target_predict: torch.Tensor, steps: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What verify_tree_greedy returns (flat rows), from ddtree_runtime's reference walk."""
    accept_local, num_accepted, _unused = follow_greedy_batch(
        tensors.candidates, tensors.retrieve_next_token, tensors.retrieve_next_sibling, target_predict, steps - 1)
    width = tensors.width
    base = torch.arange(accept_local.shape[0])[:, None] * width
    flat = torch.where(accept_local >= 0, accept_local + base, accept_local)
    predicts = target_predict.reshape(-1).clone()
    return flat.to(torch.int32), (num_accepted - 1).to(torch.int32), predicts


def test_accepted_paths_commit_the_walk_in_order() -> None:
    _unused, trees = _trees(seed=3)
    roots = torch.tensor([4, 5, 6])
    tensors = sglang_verify_inputs(trees, roots, torch.tensor([2, 2, 2]), width=10)
    generator = torch.Generator().manual_seed(1)
    target = torch.randint(0, 12, (3, 10), generator=generator)
    # Plant the first tree's deepest path so something is accepted.
    tree0 = trees.tree(0)
    deepest = int(torch.argmax(tree0.depths)) + 1
    path = tree0.path_to(deepest)
    for parent, child in itertools.pairwise(path):
        target[0, parent] = tree0.token_ids[child - 1]
    steps = 7
    accept_index, accept_num, predicts = _sglang_style_accept(tensors, target, steps)
    paths = accepted_paths(accept_index, accept_num, 10)
    for b in range(3):
        tree = trees.tree(b)
        accepted, bonus = follow_greedy(tree, target[b, : tree.num_nodes + 1])
        assert paths.nodes[b, : len(accepted)].tolist() == accepted
        assert bool((paths.nodes[b, len(accepted):] == NO_NODE).all())
        assert int(paths.lengths[b]) == len(accepted)
        tokens = committed_tokens(predicts, paths, 16)[b, : len(accepted)].tolist()
        assert tokens == [int(target[b, node]) for node in accepted]
        assert tokens[-1] == bonus
    assert len(path) == int(paths.lengths[0])


def test_accepted_first_order_is_a_permutation_with_the_path_in_front() -> None:
    accept_index = torch.tensor([[0, 2, 5, -1], [10, -1, -1, -1]], dtype=torch.int32)
    paths = accepted_paths(accept_index, torch.tensor([2, 0], dtype=torch.int32), 10)
    order = accepted_first_order(paths, 10)
    assert order[0].tolist() == [0, 2, 5, 1, 3, 4, 6, 7, 8, 9]
    assert order[1].tolist() == list(range(10))
    assert paths.rows[0].tolist() == [0, 2, 5, 5]
    assert paths.rows[1].tolist() == [10, 10, 10, 10]


def test_committed_tokens_refuse_a_narrow_output() -> None:
    accept_index = torch.tensor([[0, 1, -1]], dtype=torch.int32)
    paths = accepted_paths(accept_index, torch.tensor([1], dtype=torch.int32), 4)
    with pytest.raises(ValueError, match="narrower"):
        committed_tokens(torch.arange(4), paths, 2)


# ---- tensor-parallel top-k ------------------------------------------------------------------------------------


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_sharded_topk_equals_the_full_vocabulary_topk(ranks: int) -> None:
    generator = torch.Generator().manual_seed(ranks)
    logits = torch.randn(15, 64, generator=generator) * 3
    logits[:, 10] = logits[:, 50]  # a tie across shards: the lower id must win
    k = 8
    shards = torch.chunk(logits, ranks, dim=-1)
    offsets = [sum(s.shape[-1] for s in shards[:r]) for r in range(ranks)]
    parts = [local_topk(shard, k, offset) for shard, offset in zip(shards, offsets, strict=True)]
    log_probs, ids = merge_sharded_topk([p[0] for p in parts], [p[1] for p in parts], [p[2] for p in parts], k)
    expected_log_probs, expected_ids = depth_log_probs(logits, k)
    assert torch.equal(ids, expected_ids)
    torch.testing.assert_close(log_probs, expected_log_probs, rtol=0, atol=1e-5)


def test_every_rank_builds_the_reference_tree_from_merged_shards() -> None:
    generator = torch.Generator().manual_seed(7)
    logits = torch.randn(15, 96, generator=generator) * 2
    budget, k = 40, 8
    parts = [local_topk(shard, k, 48 * r) for r, shard in enumerate(torch.chunk(logits, 2, dim=-1))]
    log_probs, ids = merge_sharded_topk([p[0] for p in parts], [p[1] for p in parts], [p[2] for p in parts], k)
    reference = build_tree(logits, budget, max_topk=k)
    merged = build_tree_from_topk(log_probs, ids, budget)
    assert torch.equal(merged.token_ids, reference.token_ids)
    assert torch.equal(merged.parents, reference.parents)


def test_merge_refuses_an_impossible_k() -> None:
    values, ids, log_z = local_topk(torch.randn(2, 4), 3, 0)
    with pytest.raises(ValueError, match="k must be"):
        merge_sharded_topk([values], [ids], [log_z], 5)


def _server_args(**changes: object) -> object:
    from types import SimpleNamespace  # noqa: PLC0415

    fields = {"speculative_num_draft_tokens": 16, "speculative_draft_model_path": "z-lab/drafter",
              "model_path": "Qwen/Qwen3.6-27B", "device": "cuda", "page_size": 1, "attention_backend": "triton"}
    return SimpleNamespace(**{**fields, **changes})


@pytest.mark.parametrize(("changes", "message"), [
    ({"attention_backend": "fa3"}, "--attention-backend fa3 cannot verify DDTree trees"),
    ({"speculative_draft_attention_backend": "fa4"}, "--speculative-draft-attention-backend fa4"),
    ({"linear_attn_verify_backend": "flashinfer"}, "--linear-attn-verify-backend flashinfer does not verify trees"),
    ({"page_size": 16}, "needs --page-size 1"),
    ({"device": "cpu"}, "runs on CUDA only"),
    ({"speculative_num_draft_tokens": 17}, "must be in 2..16"),
    ({"speculative_draft_model_path": None}, "needs --speculative-draft-model-path"),
    ({"pp_size": 2}, "supports only --pp-size 1"),
])
def test_server_args_ddtree_refuses_are_judged_without_sglang(changes: dict[str, object], message: str) -> None:
    """The plugin's server-args rules live in a module without SGLang, so the lab's stand-in and SGLang's own
    resolution (through the registration) judge a command line by the same rules."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from ddtree_runtime.sglang.server_args_rules import validate_server_args  # noqa: PLC0415

    validate_server_args(_server_args())
    with pytest.raises(ValueError, match="--speculative-algorithm DDTREE: ") as refused:
        validate_server_args(_server_args(**changes))
    assert message in str(refused.value)
    probe = ("import sys, ddtree_runtime.sglang.server_args_rules; "
             "sys.exit(any(m == 'sglang' or m.startswith('sglang.') or m == 'torch' for m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", probe], check=False).returncode == 0
