"""``DDTreeWorker``: SGLang 0.5.23's ``DFlashWorkerV2`` with a DDTree verify instead of the linear block.

Needs a CUDA GPU. On CPU it is checked for importing, subclassing and the names it calls (tests/contract); on a GPU
the acceptance suite (``python -m ddtree_runtime.acceptance``) serves with it in stock SGLang and holds its output to
the non-speculative server's (docs/sglang-plugin.md).

One decode round per batch (prefill, idle and DP-idle rounds are the parent's):

1. Draft: the parent's block ``[bonus, mask x (D-1)]`` through the DFlash drafter (TARGET_VERIFY mode).
2. Tree: per request, per-depth float32 top-k log-probabilities of the drafter's D-1 marginals over the target's
   ``lm_head``; under tensor parallelism each rank takes its vocab shard's top-k and logsumexp, all ranks gather
   them (:func:`ddtree_runtime.sglang.tree_inputs.merge_sharded_topk`), so every rank builds the same tree
   (``ddtree_runtime.ops`` kernels when built, else :func:`ddtree_runtime.tree.build_tree_batch_from_topk`).
3. Verify: the target runs ``W = DDTREE_BUDGET + 1`` tokens per request with the tree's custom mask and depth
   positions; SGLang's ``eagle_sample`` walks the tree (``verify_tree_greedy_func`` when greedy,
   ``tree_speculative_sampling_target_only`` otherwise; results broadcast from TP rank 0).
4. Commit: the request's ``W`` KV slots are permuted in ``req_to_token`` so the accepted path comes first (no copy,
   no slot freed or leaked; needs page size 1), the drafter KV gets the accepted nodes' target features, hybrid
   models commit the mamba state of the last accepted node, and the bonus token seeds the next round.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs_func
from sglang.srt.arg_groups.overrides import resolving_view
from sglang.srt.layers.logprob_processor import compute_spec_logprobs
from sglang.srt.layers.sampler import apply_custom_logit_processor
from sglang.srt.lora.layers import unwrap_lora_layer
from sglang.srt.managers.scheduler import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
from sglang.srt.runtime_context import get_parallel, get_spec, mamba_track_grid
from sglang.srt.speculative.dflash_info import DFlashVerifyInput
from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2, _resolve_dflash_embedding_module
from sglang.srt.speculative.eagle_utils import eagle_sample
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_utils import GrammarTree, build_grammar_vocab_mask

from ddtree_runtime import ops
from ddtree_runtime.ops import VerifyInputs
from ddtree_runtime.sglang.config import ENV_DEBUG_TREE_DIGEST, resolve_settings
from ddtree_runtime.sglang.round_stages import RoundStages
from ddtree_runtime.sglang.server_args_rules import refuse_mamba_tracking
from ddtree_runtime.sglang.tree_inputs import (
    AcceptedPaths,
    accepted_first_order,
    accepted_paths,
    committed_tokens,
    compiled_sglang_verify_inputs,
    gather_merged_topk,
    local_topk,
    round_digest,
    sglang_verify_inputs,
)
from ddtree_runtime.tree import build_tree_batch_from_topk

logger = logging.getLogger(__name__)


@dataclass
class DDTreeVerifyInput(DFlashVerifyInput):
    """DFlash's verify input plus the EAGLE-style tree fields SGLang's tree paths read.

    ``topk > 1`` makes FA3 apply ``custom_mask`` and the hybrid GDN backend run its tree-aware scan from
    ``retrieve_next_token`` / ``retrieve_next_sibling``; ``eagle_sample`` reads the ``retrieve_*`` lists,
    ``tree_topk``, ``max_tree_depth`` and ``draft_probs``.
    """

    retrieve_index: torch.Tensor | None = None
    retrieve_next_token: torch.Tensor | None = None
    retrieve_next_sibling: torch.Tensor | None = None
    max_tree_depth: int = 1
    draft_probs: torch.Tensor | None = None

    @property
    def tree_topk(self) -> int:
        return int(self.topk)

    @classmethod
    def for_graph_capture(cls, *, custom_mask: torch.Tensor, width: int) -> DDTreeVerifyInput:
        settings = resolve_settings(get_spec().speculative_num_draft_tokens)
        return cls(
            draft_token=None,  # type: ignore[arg-type]  # capture dummies carry shapes only
            positions=None,  # type: ignore[arg-type]
            draft_token_num=int(width),
            topk=settings.verify_topk,
            custom_mask=custom_mask,
            capture_hidden_mode=CaptureHiddenMode.FULL,
            max_tree_depth=settings.draft_tokens,
        )


def uses_compiled_kernels() -> bool:
    """Whether rounds run on ``ddtree_runtime.ops``' CUDA kernels (the extension is built and loads)."""
    return ops.extension_available()


class DDTreeWorker(DFlashWorkerV2):
    """DFlash V2 worker whose decode rounds draft, verify and commit DDTree trees (overlap scheduling or not)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ddtree = resolve_settings(int(self.block_size))
        self._refuse_unsupported_drafting()
        # On the resolved arguments: `--mamba-radix-cache-strategy auto` became extra_buffer after validation.
        refuse_mamba_tracking(resolving_view(self.server_args), self.ddtree)
        self._compiled = uses_compiled_kernels()
        self._check_digests = os.environ.get(ENV_DEBUG_TREE_DIGEST, "") == "1"
        self._round = 0
        logger.info(
            "DDTree worker: draft length %d, budget %d, top-k cap %s, verify width %d, tree builder %s",
            self.ddtree.draft_tokens, self.ddtree.budget, self.ddtree.max_topk, self.ddtree.verify_width,
            "ddtree_runtime.ops (compiled CUDA kernels)" if self._compiled
            else f"ddtree_runtime.tree (PyTorch; {ops.extension_error()})",
        )

    def _refuse_unsupported_drafting(self) -> None:
        variants = {
            "selector": getattr(self, "selector", None) is not None,
            "LiLiCorr": getattr(self, "lilicorr", None) is not None,
            "Domino": bool(getattr(self, "_is_domino", False)),
        }
        used = [name for name, on in variants.items() if on]
        if used:
            raise ValueError(f"DDTREE drafts from the plain DFlash head; unsupported draft samplers: {used}")

    def _maybe_build_draft_sampler(self) -> None:
        # The in-graph greedy sampler returns only argmax ids; DDTree needs the drafter's hidden states.
        return None

    # ---- decode round ---------------------------------------------------------------------------------------

    def forward_batch_generation(
        self, batch: Any, on_publish: Any = None, grammar_barrier: Any = None, pp_proxy_tensors: Any = None
    ) -> GenerationBatchResult:
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch or batch.forward_mode.is_idle():
            return super().forward_batch_generation(batch, on_publish, grammar_barrier, pp_proxy_tensors)
        if batch.spec_info is None or not isinstance(batch.spec_info, DFlashDraftInputV2):
            raise RuntimeError("DDTREE expected DFlashDraftInputV2 state on the running batch")
        self._validate_phase1_sampling_support(batch)
        stages = RoundStages()
        try:
            return self._tree_round(batch, stages, on_publish, grammar_barrier)
        finally:
            stages.close()

    def _tree_round(
        self, batch: Any, stages: RoundStages, on_publish: Any, grammar_barrier: Any = None
    ) -> GenerationBatchResult:
        draft_input = batch.spec_info
        # Under overlap scheduling the lengths come from the previous round, possibly on another stream.
        batch.seq_lens.record_stream(torch.cuda.current_stream(batch.seq_lens.device))
        prefix_lens = batch.seq_lens
        bs = len(prefix_lens)
        width = self.ddtree.verify_width
        stages.enter("draft")
        draft_hidden = self._draft_block_hidden(batch, draft_input.bonus_tokens)
        stages.enter("topk")
        log_probs, ids = self._draft_topk(draft_hidden, bs)
        stages.enter("tree")
        inputs = self._verify_inputs(log_probs, ids, draft_input.bonus_tokens, batch)
        if self._check_digests:
            self._compare_tree_digests(inputs)
        stages.enter("verify")
        verify_locs = assign_extend_cache_locs_func(
            req_pool_indices=batch.req_pool_indices,
            req_to_token=self.model_runner.req_to_token_pool.req_to_token,
            start_offset=prefix_lens,
            end_offset=prefix_lens + width,
            batch_size=bs,
            draft_token_num=width,
            device=self.device,
        ).view(bs, width)
        seq_lens_pre_verify = batch.seq_lens.clone()
        # Built before the verify launch so its device-to-host copy overlaps the forward (as EAGLE does).
        grammar_tree = GrammarTree.from_device(
            inputs.retrieve_next_token, inputs.retrieve_next_sibling, inputs.candidates
        ) if batch.has_grammar else None
        logits_output, target_out, verify_input = self._verify(batch, draft_input, inputs, verify_locs)
        stages.enter("accept")
        grammar_mask = None
        if grammar_tree is not None:
            grammar_mask = build_grammar_vocab_mask(
                reqs=batch.reqs, tree=grammar_tree, sampling_info=batch.sampling_info,
                device=logits_output.next_token_logits.device, barrier=grammar_barrier,
            )
        if batch.sampling_info.has_custom_logit_processor:
            # As DFLASH's verify does; eagle_sample applies penalties, logit bias and the grammar mask itself.
            apply_custom_logit_processor(
                logits_output.next_token_logits, batch.sampling_info, num_tokens_in_batch=width
            )
        predict, accept_lens, accept_index = eagle_sample(verify_input, batch, logits_output, grammar_mask)
        paths = accepted_paths(accept_index, accept_lens - 1, width)
        if batch.return_logprob:
            # Rows of the accepted nodes, in path order: the same [B, S] layout as the committed tokens.
            compute_spec_logprobs(batch, logits_output, predict, accept_index=paths.rows)
        stages.enter("commit")
        new_seq_lens = prefix_lens + paths.lengths.to(prefix_lens.dtype)
        # The accepted path first, then the other slots: how both the target's and the drafter's KV are committed.
        order = accepted_first_order(paths, width)
        self._commit_kv(batch, order, verify_locs)
        if self._need_mamba_verify_commit:
            self._commit_mamba_state(batch, seq_lens_pre_verify, new_seq_lens, paths)
        if on_publish is not None:
            on_publish(new_seq_lens)
        write_ids = self._draft_write_ids(verify_input.kv_loc_plan).view(bs, width)
        self._append_committed_features(logits_output.hidden_states, paths, order, write_ids, prefix_lens)
        logits_output.hidden_states = None
        out_tokens = committed_tokens(predict, paths, int(self.block_size))
        bonus = torch.gather(out_tokens, 1, (paths.lengths - 1)[:, None]).view(-1)
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=out_tokens.reshape(-1),
            accept_lens=paths.lengths.to(torch.int32),
            can_run_cuda_graph=target_out.can_run_cuda_graph,
            next_draft_input=self._make_next_draft_input_decode(bonus_tokens=bonus, new_seq_lens=new_seq_lens),
            speculative_num_draft_tokens=int(self.block_size),
            new_seq_lens=new_seq_lens,
            routed_experts_output=target_out.routed_experts_output,
            indexer_topk_output=target_out.indexer_topk_output,
        )

    # ---- 1) draft ---------------------------------------------------------------------------------------------

    def _draft_block_hidden(self, batch: Any, bonus_tokens: torch.Tensor) -> torch.Tensor:
        """Run the drafter over ``[bonus, mask x (D-1)]`` (the parent's eager block path); ``[bs, D, H]``."""
        bs = len(batch.seq_lens)
        block = int(self.block_size)
        self._ensure_draft_block_buffers(bs)
        block_ids = self._draft_block_ids_buf[:bs]
        positions_2d = self._draft_block_positions_buf[:bs]
        block_locs = self._draft_verify_out_cache_loc_buf[:bs]
        block_ids.fill_(int(self._mask_token_id))
        block_ids[:, 0].copy_(bonus_tokens.view(-1))
        torch.add(batch.seq_lens.unsqueeze(1), self._block_pos_offsets, out=positions_2d)
        block_locs.copy_(
            assign_extend_cache_locs_func(
                req_pool_indices=batch.req_pool_indices,
                req_to_token=self.model_runner.req_to_token_pool.req_to_token,
                start_offset=batch.seq_lens,
                end_offset=batch.seq_lens + block,
                batch_size=bs,
                draft_token_num=block,
                device=self.device,
            ).view(bs, block)
        )
        target_model = self.target_worker.model_runner.model
        embed = unwrap_lora_layer(_resolve_dflash_embedding_module(self.draft_model, target_model))
        noise = torch.nn.functional.embedding(block_ids, self._full_embed_gpu) if self._full_embed_gpu is not None \
            else embed(block_ids)
        if self._noise_embed_scale != 1.0:
            noise = noise * self._noise_embed_scale
        seq_lens_cpu = self._draft_seq_lens_cpu_buf[:bs]
        seq_lens_cpu.copy_(self._host_seq_lens(batch))
        seq_lens_cpu.add_(block)
        plan = self.target_worker.model_runner.kv_index_translator.plan(
            req_pool_indices=batch.req_pool_indices,
            seq_lens=batch.seq_lens,
            seq_lens_cpu=self._host_seq_lens(batch),
            write_virtual=block_locs.reshape(-1),
            read_extent=block,
        )
        forward_batch = ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY,
            batch_size=bs,
            input_ids=block_ids.flatten(),
            req_pool_indices=batch.req_pool_indices,
            seq_lens=batch.seq_lens,
            out_cache_loc=block_locs.reshape(-1),
            seq_lens_sum=int(seq_lens_cpu.sum()),
            seq_lens_cpu=seq_lens_cpu,
            positions=positions_2d.reshape(-1),
            input_embeds=noise.view(-1, noise.shape[-1]),
            spec_algorithm=SpeculativeAlgorithm.DFLASH,
            spec_info=self._draft_block_spec_info,
            capture_hidden_mode=CaptureHiddenMode.NULL,
            global_num_token_non_padded_cpu=bs * block,
            can_run_decode_cuda_graph=batch.can_run_decode_cuda_graph,
        )
        plan.bind(forward_batch, self.draft_model_runner.kv_index_translator)
        with torch.inference_mode():
            draft_out = self.draft_model_runner.forward(forward_batch)
        hidden = draft_out.logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DDTREE: the DFlash drafter returned no hidden states")
        return hidden.view(bs, block, -1)

    @staticmethod
    def _host_seq_lens(batch: Any) -> torch.Tensor:
        """Committed lengths known on the host, or an upper bound; never a device read.

        Under overlap scheduling SGLang publishes the exact lengths when the attention backend asks for them (the
        triton backend does); otherwise the lengths reserved for this round bound them, as DFLASH uses them.
        Both only size the host-side plans and the flat tree mask, whose per-request offsets the kernels take from
        the device lengths.
        """
        if batch.seq_lens_cpu is not None:
            return batch.seq_lens_cpu
        reserved = getattr(batch.spec_info, "nxt_kv_lens_cpu", None)
        if reserved is None:
            raise RuntimeError("DDTREE: the batch carries neither host sequence lengths nor the reserved lengths")
        return reserved.to(torch.int64)

    # ---- 2) tree ----------------------------------------------------------------------------------------------

    def _draft_topk(self, draft_hidden: torch.Tensor, bs: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-depth float32 top-k log-probabilities and ids ``[B, L, k]`` of the drafter's positions over the
        target's LM head (TP-gathered)."""
        depth = self.ddtree.max_depth
        hidden = draft_hidden[:, 1 : depth + 1, :].reshape(bs * depth, -1)
        lm_head = unwrap_lora_layer(self.target_worker.model_runner.model.lm_head)
        vocab = int(self.model_runner.model_config.vocab_size)
        k = self.ddtree.topk_for_vocab(vocab)
        log_probs, ids = self._global_topk(hidden, lm_head, k)
        return log_probs.view(bs, depth, k), ids.view(bs, depth, k)

    def _verify_inputs(
        self, log_probs: torch.Tensor, ids: torch.Tensor, bonus_tokens: torch.Tensor, batch: Any
    ) -> VerifyInputs:
        """The trees built from the per-depth top-k, and their verify inputs."""
        seq_lens_sum = int(self._host_seq_lens(batch).sum())
        if self._compiled:
            return compiled_sglang_verify_inputs(log_probs, ids, bonus_tokens, batch.seq_lens,
                                                 seq_lens_sum=seq_lens_sum, budget=self.ddtree.budget)
        budgets = torch.full((log_probs.shape[0],), self.ddtree.budget, dtype=torch.long, device=log_probs.device)
        trees = build_tree_batch_from_topk(log_probs, ids, budgets)
        return sglang_verify_inputs(trees, bonus_tokens, batch.seq_lens, width=self.ddtree.verify_width,
                                    seq_lens_sum=seq_lens_sum)

    def _global_topk(self, hidden: torch.Tensor, lm_head: Any, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        weight = lm_head.weight
        shard = getattr(lm_head, "shard_indices", None)
        num_org = int(shard.num_org_elements) if shard is not None else int(self.model_runner.model_config.vocab_size)
        offset = int(shard.org_vocab_start_index) if shard is not None else 0
        logits = torch.matmul(hidden.to(weight.dtype), weight[:num_org].T)
        tp_group = get_parallel().tp_group
        world = int(tp_group.world_size)
        if world == 1 and self._compiled:
            # Fused top-k + float32 log-normaliser over [B, L, V], no host read.
            top = ops.topk_log_probs(logits.view(-1, self.ddtree.max_depth, logits.shape[-1]), k)
            return top.log_probs.reshape(-1, k), top.ids.reshape(-1, k)
        values, ids, log_z = local_topk(logits, k, offset)
        # Every rank gathers every shard's candidates and normaliser, then runs the same merge.
        return gather_merged_topk(values, ids, log_z, k, world=world,
                                  all_gather=lambda t: tp_group.all_gather(t, dim=0))

    def _compare_tree_digests(self, inputs: VerifyInputs) -> None:
        """Debug mode: every TP rank must have built the same trees this round (reads the device: debug only)."""
        self._round += 1
        tp_group = get_parallel().tp_group
        world = int(tp_group.world_size)
        digest = round_digest(inputs)
        every = tp_group.all_gather(digest.contiguous(), dim=0).view(world, -1) if world > 1 else digest[None]
        agree = bool((every == every[0]).all())
        logger.info("DDTree round %d: tree digest %s on %d rank(s), %s", self._round, digest.tolist(), world,
                    "equal" if agree else "DIFFERENT")
        if not agree:
            raise RuntimeError(f"DDTREE: TP ranks built different trees in round {self._round}: {every.tolist()}")

    # ---- 3) verify --------------------------------------------------------------------------------------------

    def _verify(
        self, batch: Any, draft_input: Any, inputs: VerifyInputs, verify_locs: torch.Tensor
    ) -> tuple[Any, Any, DDTreeVerifyInput]:
        width = inputs.width
        plan = self.target_worker.model_runner.kv_index_translator.plan(
            req_pool_indices=batch.req_pool_indices,
            seq_lens=batch.seq_lens,
            seq_lens_cpu=self._host_seq_lens(batch),
            write_virtual=verify_locs.reshape(-1),
            read_extent=width,
        )
        verify_input = DDTreeVerifyInput(
            draft_token=inputs.candidates.reshape(-1),
            positions=inputs.positions.reshape(-1),
            draft_token_num=width,
            topk=self.ddtree.verify_topk,
            custom_mask=inputs.custom_mask,
            capture_hidden_mode=CaptureHiddenMode.FULL,
            kv_loc_plan=plan,
            retrieve_index=inputs.retrieve_index,
            retrieve_next_token=inputs.retrieve_next_token,
            retrieve_next_sibling=inputs.retrieve_next_sibling,
            max_tree_depth=int(self.block_size),
        )
        batch.out_cache_loc = verify_locs.reshape(-1)
        seq_lens_cpu_backup, seq_lens_sum_backup = batch.seq_lens_cpu, batch.seq_lens_sum
        host = self._host_seq_lens(batch) + width
        batch.seq_lens_cpu, batch.seq_lens_sum = host, int(host.sum())
        forward_batch, _unused = verify_input.prepare_for_verify(batch, self.target_worker)
        batch.seq_lens_cpu, batch.seq_lens_sum = seq_lens_cpu_backup, seq_lens_sum_backup
        target_out = self.target_worker.forward_batch_generation(
            batch=None, forward_batch=forward_batch, is_verify=True, skip_attn_backend_init=True
        )
        logits_output = target_out.logits_output
        target_lp = self._target_logits_processor
        if target_lp is not None and target_lp.is_deferred_shard(logits_output.next_token_logits):
            # The tree walk needs full-vocabulary logits on every node (argmax or sampling), never a shard.
            logits_output.next_token_logits = target_lp.finish_deferred_gather(logits_output.next_token_logits)
        if logits_output.hidden_states is None:
            raise RuntimeError("DDTREE verify needs the target's aux hidden states, got None")
        return logits_output, target_out, verify_input

    # ---- 4) commit --------------------------------------------------------------------------------------------

    def _commit_kv(self, batch: Any, order: torch.Tensor, verify_locs: torch.Tensor) -> None:
        """Permute each request's W verify slots (``order``: :func:`accepted_first_order`) so the accepted path
        occupies positions prefix..prefix+tau-1."""
        width = verify_locs.shape[1]
        columns = batch.seq_lens[:, None].to(torch.long) + torch.arange(width, device=verify_locs.device)[None, :]
        rows = batch.req_pool_indices[:, None].to(torch.long).expand(-1, width)
        req_to_token = self.model_runner.req_to_token_pool.req_to_token
        req_to_token[rows, columns] = torch.gather(verify_locs, 1, order).to(req_to_token.dtype)

    def _append_committed_features(
        self, hidden: torch.Tensor, paths: AcceptedPaths, order: torch.Tensor, write_ids: torch.Tensor,
        prefix_lens: torch.Tensor,
    ) -> None:
        """Write the accepted nodes' target features into the drafter KV at their committed positions.

        ``order`` is the round's :func:`accepted_first_order`; ``write_ids`` are the verify slots as the draft pool
        indexes them (the parent's ``_draft_write_ids``). Only
        the first min(D, W) columns go to the drafter: no accepted path is longer, and the fused writer computes
        K/V and rotary for every row it is given (rows past D would reach past its ``context + D`` rotary cache).
        """
        bs, width = write_ids.shape
        kept = min(int(self.block_size), width)  # a path is at most min(D, W) nodes long
        order = order[:, :kept]
        rows = (torch.arange(bs, device=order.device)[:, None] * width + order).reshape(-1)
        features = hidden.view(bs * width, -1)[rows]
        cache_loc_2d = torch.gather(write_ids, 1, order)
        offsets = torch.arange(kept, device=order.device)[None, :]
        positions = (prefix_lens[:, None].to(torch.long) + offsets).reshape(-1)
        self._append_target_hidden_to_draft_kv_by_loc(
            target_hidden=features,
            cache_loc=cache_loc_2d.reshape(-1),
            cache_loc_2d=cache_loc_2d,
            positions=positions,
            commit_lens=paths.lengths.to(torch.int32),
        )

    def _commit_mamba_state(
        self, batch: Any, seq_lens_pre: torch.Tensor, seq_lens_post: torch.Tensor, paths: AcceptedPaths
    ) -> None:
        """Hybrid targets: keep the recurrent state of the last accepted *node* (the tree scan's per-node states)."""
        attn_backend = self.target_worker.model_runner.attn_backend
        if not hasattr(attn_backend, "update_mamba_state_after_mtp_verify"):
            return
        last_nodes = torch.gather(paths.nodes, 1, (paths.lengths - 1)[:, None]).view(-1)
        steps_to_track = None
        if batch.mamba_track_indices is not None:
            interval = mamba_track_grid(batch.tree_cache.page_size)
            crosses = seq_lens_pre // interval != seq_lens_post // interval
            path_step = torch.clamp(seq_lens_post // interval * interval - seq_lens_pre - 1, min=0).to(torch.long)
            trackable = crosses & (path_step < paths.lengths)
            node_at_step = torch.gather(paths.nodes, 1, path_step.clamp(max=paths.nodes.shape[1] - 1)[:, None]).view(-1)
            steps_to_track = torch.where(trackable, node_at_step, torch.full_like(node_at_step, -1))
        attn_backend.update_mamba_state_after_mtp_verify(
            last_correct_step_indices=last_nodes,
            mamba_track_indices=batch.mamba_track_indices,
            mamba_steps_to_track=steps_to_track,
            model=self.target_worker.model_runner.model,
            req_pool_indices=batch.req_pool_indices[: last_nodes.shape[0]],
        )
