"""Log-probs and entropies of sampled tokens from a causal LM without a [B, T, vocab] fp32 tensor: the numeric kernel
of re-scoring (`rl/rescore.py`), of the update (`rl/optimize.py`) and of the weight-sync probe (`rl/weight_sync.py`).

With Qwen2.5's 151,936-token vocabulary one fp32 [8, 1024, vocab] log-softmax is 5 GB, and re-scoring runs it
three times per sample (old, skill, ref). Here logits are formed only at response positions, a chunk of tokens at
a time, and upcast to fp32 one chunk at a time. Under autograd each chunk is recomputed in backward (saves the
logits' memory, costs one more lm_head matmul per chunk) and its softmax gradient is written by hand, so peak
memory is about 2 × chunk_tokens × vocab × 4 bytes whatever B × T is (bench/logprob_memory.py measures it).

`Scorer` is a causal LM as that function (what DDP and FSDP wrap); `score_responses` scores (prompt, response) pairs
with it, packed into micro-batches by length and right-padded only to the longest of each.

Shared prefixes (`share_prefix`): the rows of a micro-batch often begin with the same tokens (an agent's turn-samples
repeat its system prompt and, within a group, the whole game description: text EZPoints 370 of 475 prompt tokens).
Then the decoder runs that prefix once, on one row, and the rows' own tokens attend to its keys and values repeated
over the batch: the same states as a full forward up to float rounding, and under autograd every row's gradient
flows back into the one prefix computation (the sum a full forward gives). `pack_by_prefix` orders the rows so that
those that begin alike share a micro-batch (bench/shared_prefix.py measures the gain).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from seedcli.precision import autocast
from seedcli.rl.batching import VisionFn, pack_by_length, pack_by_prefix, pad_right
from seedcli.rl.distributed import unwrap
from seedcli.rl.lora import adapter_disabled, lora_layers
from seedcli.rl.samples import BLANK_IMAGE

# A score function: (input_ids [B, T], attention_mask [B, T], response_mask [B, T]) → per-token log-probs [B, T];
# a vision-language model's also takes `pixel_values=` and `image_grid_thw=` for the rows' images.
ScoreFn = Callable[..., torch.Tensor]


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor, chunk_rows: int = 1024) -> torch.Tensor:
    """`log_softmax(logits, -1)` gathered at `index` ([..., V] and [...] → [...]), `chunk_rows` rows at a time.

    fp32/fp64: gather − logsumexp. bf16/fp16: log_softmax per chunk in the input dtype, because
    logsumexp is not stable there (as TRL's `selective_log_softmax`). The result has the dtype of `logits`.
    """
    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab)  # [N, V]
    flat_index = index.reshape(-1, 1)  # [N, 1]
    if logits.dtype in (torch.float32, torch.float64):
        selected = flat.gather(-1, flat_index).squeeze(-1)  # [N]
        lse = torch.cat([torch.logsumexp(rows, dim=-1) for rows in flat.split(chunk_rows)])  # [N]
        out = selected - lse
    else:
        out = torch.cat(
            [
                F.log_softmax(rows, dim=-1).gather(-1, idx).squeeze(-1)
                for rows, idx in zip(flat.split(chunk_rows), flat_index.split(chunk_rows), strict=True)
            ]
        )
    return out.view(index.shape)


def chunked_entropy(logits: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim ([..., V] → [...], fp32), `chunk` rows upcast at a time."""
    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab)  # [N, V]
    out = torch.cat([_entropy_fp32(rows.float()) for rows in flat.split(chunk)])  # [N]
    return out.view(logits.shape[:-1])


def _entropy_fp32(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of each row of fp32 [n, V] logits: logsumexp(l) − Σ softmax(l)·l."""
    lse = torch.logsumexp(logits, dim=-1)  # [n]
    probs = torch.exp(logits - lse.unsqueeze(-1))  # [n, V]
    return lse - (probs * logits).sum(-1)


class _TokenScores(torch.autograd.Function):
    """(log p(target), entropy) of fp32 logits [n, V] → [n] each, with a hand-written backward.

    Autograd through logsumexp/gather/softmax would hold ~5 [n, V] buffers in backward; this holds ≤ 3.
    """

    @staticmethod
    def forward(ctx, logits, targets, with_entropy):
        lse = torch.logsumexp(logits, dim=-1)  # [n]
        logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse  # [n]
        if with_entropy:
            weighted = torch.exp(logits - lse.unsqueeze(-1)).mul_(logits)  # [n, V]: p·l, in place
            entropy = lse - weighted.sum(-1)
            del weighted
        else:
            entropy = logits.new_zeros(logits.shape[0])
        ctx.save_for_backward(logits, targets, lse, entropy)
        ctx.with_entropy = with_entropy
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        logits, targets, lse, entropy = ctx.saved_tensors
        # d logp/dl = onehot(target) − p;  dH/dl = −p·(log p + H)
        log_probs = logits - lse.unsqueeze(-1)  # [n, V]; becomes the gradient, in place
        if ctx.with_entropy:
            probs = torch.exp(log_probs)  # [n, V]
            grad = log_probs.add_(entropy.unsqueeze(-1)).mul_(grad_entropy.unsqueeze(-1))
            grad = grad.add_(grad_logp.unsqueeze(-1)).mul_(probs).neg_()
            del probs
        else:
            grad = log_probs.exp_().mul_(-grad_logp.unsqueeze(-1))
        grad.scatter_add_(-1, targets.unsqueeze(-1), grad_logp.unsqueeze(-1))
        return grad, None, None


def _chunk_scores(
    head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 (log-prob of `targets` [n], entropy [n] or zeros) from hidden states [n, H]."""
    return _TokenScores.apply(head(hidden).float(), targets, with_entropy)


def _unwrap(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(decoder trunk, lm_head) of a Hugging Face causal LM, also when PEFT wraps it (LoRA layers stay active)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder(), base.get_output_embeddings()


# a common prefix shorter than this runs with the rest: a second decoder call would cost more than it saves
MIN_SHARED_PREFIX = 32


def shared_prefix_len(input_ids: torch.Tensor, attention_mask: torch.Tensor, response_mask: torch.Tensor) -> int:
    """The number of leading columns that every row of a micro-batch holds alike (same token, not padding), ended
    before the column whose state predicts any row's first response token (each row's own part must hold it).
    0 for one row, or when a row has no response token."""
    if input_ids.shape[0] < 2:
        return 0
    resp = response_mask.bool()
    if not resp.any(-1).all():
        return 0
    limit = int(resp.float().argmax(-1).min()) - 1  # the first response column of the earliest row, less one
    if limit <= 0:
        return 0
    alike = (input_ids[:, :limit] == input_ids[:1, :limit]).all(0) & attention_mask[:, :limit].bool().all(0)
    return limit if bool(alike.all()) else int((~alike).float().argmax())


def _suffix_hidden(
    decoder: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, p: int
) -> torch.Tensor:
    """The decoder's last hidden states of columns p.. of every row ([B, T − p, H]), the p shared columns run once
    (row 0) and their keys and values repeated over the rows."""
    prefix = decoder(
        input_ids=input_ids[:1, :p], attention_mask=attention_mask[:1, :p], position_ids=position_ids[:1, :p],
        use_cache=True,
    )  # fmt: skip
    cache = prefix.past_key_values
    cache.batch_repeat_interleave(input_ids.shape[0])  # differentiable: every row's gradient reaches the prefix
    return decoder(
        input_ids=input_ids[:, p:], attention_mask=attention_mask, position_ids=position_ids[:, p:],
        past_key_values=cache, use_cache=True,
    ).last_hidden_state  # fmt: skip


def sequence_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    with_entropy: bool = False,
    chunk_tokens: int = 1024,
    vision: dict | None = None,
    share_prefix: bool = False,
    tally: list[int] | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Per-token log p(input_ids[t] | input_ids[<t]) at the positions of `response_mask` ([B, T] → [B, T] fp32).

    Other positions (and t = 0, which has no context) hold 0. With `with_entropy` also returns the entropy of the
    same next-token distributions. Position ids follow `attention_mask`, so left padding scores like no padding.
    Gradients flow when called with grad enabled; logits exist only for `chunk_tokens` tokens at a time.
    `vision` (a vision-language model's `pixel_values` and `image_grid_thw` for the rows' images, in row order)
    runs the vision tower and places its features at the image tokens; the model then sets its own 3-D positions.
    `share_prefix`: the rows' common leading tokens (right-padded rows; `shared_prefix_len`) run once (module doc);
    not with `vision`, nor under gradient checkpointing (which turns the decoder's cache off). `tally` (if given)
    gains [the rows' tokens, the tokens a shared prefix did not run again].
    """
    decoder, head = _unwrap(model)
    offset = 0  # hidden[:, j] is column offset + j
    if vision:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        # image tokens marked 1: Qwen2.5-VL computes its 3-D M-RoPE positions only when given them (transformers 5)
        types = (input_ids == base.config.image_token_id).to(torch.int32)
        hidden = base.model(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False, mm_token_type_ids=types, **vision
        ).last_hidden_state  # [B, T, H]
    else:
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # [B, T], as generation assigns them
        checkpointed = decoder.training and getattr(decoder, "gradient_checkpointing", False)
        p = shared_prefix_len(input_ids, attention_mask, response_mask) if share_prefix and not checkpointed else 0
        if p >= MIN_SHARED_PREFIX:
            hidden, offset = _suffix_hidden(decoder, input_ids, attention_mask, position_ids, p), p  # [B, T − p, H]
            if tally is not None:
                tally[1] += (input_ids.shape[0] - 1) * p
        else:
            hidden = decoder(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
            ).last_hidden_state  # [B, T, H]

    if tally is not None:
        tally[0] += int(attention_mask.sum())
    wanted = response_mask.bool().clone()
    wanted[:, 0] = False  # the first token has no prediction
    rows, cols = wanted.nonzero(as_tuple=True)  # [N] each
    h = hidden[rows, cols - 1 - offset]  # [N, H]: the state at t − 1 predicts token t
    targets = input_ids[rows, cols]  # [N]

    recompute = torch.is_grad_enabled() and h.requires_grad
    logp_parts, ent_parts = [], []
    for start in range(0, h.shape[0], chunk_tokens):
        h_chunk, t_chunk = h[start : start + chunk_tokens], targets[start : start + chunk_tokens]
        if recompute:
            logp_c, ent_c = checkpoint(_chunk_scores, head, h_chunk, t_chunk, with_entropy, use_reentrant=False)
        else:
            logp_c, ent_c = _chunk_scores(head, h_chunk, t_chunk, with_entropy)
        logp_parts.append(logp_c)
        ent_parts.append(ent_c)

    def place(parts: list[torch.Tensor]) -> torch.Tensor:
        values = torch.cat(parts) if parts else hidden.new_zeros(0, dtype=torch.float32)
        out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)  # [B, T]
        return out.index_put((rows, cols), values)

    logp = place(logp_parts)
    if with_entropy:
        return logp, place(ent_parts)
    return logp


def _fully_sharded(module: torch.nn.Module) -> bool:
    """FSDP2 frees a layer's gathered weights after each call, and a second call's backward needs them (measured:
    "setStorage … out of bounds for storage of size 0"): under it the scorer runs whole rows (still packed by prefix,
    so that its micro-batches are those of DDP and one process)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return False
    return isinstance(module, FSDPModule)


class Scorer(torch.nn.Module):
    """A causal LM as `(input_ids, attention_mask, response_mask) → per-token log-probs [B, T]` (and entropies).

    DDP and FSDP hook into a module's forward, and `sequence_logprobs` calls the decoder and lm_head separately;
    routing it through this module's forward keeps gradient sync (DDP) and parameter gathering (FSDP) correct."""

    def __init__(
        self,
        lm: torch.nn.Module,
        chunk_tokens: int = 1024,
        compute_dtype: torch.dtype | None = None,
        share_prefix: bool = False,
    ):
        super().__init__()
        self.lm = lm
        self.chunk_tokens = chunk_tokens
        self.share_prefix = share_prefix  # the rows' common prefix runs once (module doc)
        self.tally = [0, 0]  # [tokens scored, tokens a shared prefix did not run again] since `take_tally`
        # bf16: the matmuls under autocast over the fp32 master weights (seedcli/precision.py); the log-softmax,
        # entropy and everything the loss computes from the log-probs stay fp32 (the chunks upcast the logits)
        self.compute_dtype = compute_dtype

    def forward(
        self, input_ids, attention_mask, response_mask, with_entropy: bool = False, reference: bool = False, **vision
    ):
        """`reference`: a LoRA actor's forward with its adapter disabled, the base model (the KL reference of
        `seed rl lora=true`, rl/lora.py)."""
        off = self._adapter_off() if reference else contextlib.nullcontext()
        with off, autocast(self.compute_dtype, input_ids.device):
            return sequence_logprobs(
                self.lm,
                input_ids,
                attention_mask,
                response_mask,
                with_entropy=with_entropy,
                chunk_tokens=self.chunk_tokens,
                vision=vision or None,
                share_prefix=self.share_prefix and not _fully_sharded(self),
                tally=self.tally,
            )

    def _adapter_off(self):
        if not hasattr(self, "_lora_layers"):
            self._lora_layers = lora_layers(self.lm)
        if not self._lora_layers:
            raise ValueError("reference=True scores the base of a LoRA actor; this scorer's model has no adapter")
        return adapter_disabled(self._lora_layers)

    def take_tally(self) -> list[int]:
        """[tokens scored, tokens a shared prefix saved] since the last call, and start counting afresh."""
        out, self.tally = self.tally, [0, 0]
        return out


def shares_prefix(score_fn: ScoreFn) -> bool:
    """Whether a score function (a `Scorer`, bare, under FSDP2 or inside DDP) runs its rows' common prefix once."""
    return bool(getattr(unwrap(score_fn), "share_prefix", False))


@torch.no_grad()
def score_responses(
    score_fn: ScoreFn,
    contexts: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    max_tokens: int,
    pad_id: int,
    device: torch.device | str = "cpu",
    sync_count: Callable[[int], int] | None = None,
    images: Sequence[list[str]] | None = None,
    vision: VisionFn | None = None,
    padding_ids: Sequence[int] | None = None,
    by_prefix: bool | None = None,
) -> list[torch.Tensor]:
    """Log-prob of each response token given its prompt, for (prompt_ids, response_ids) pairs; returns one fp32
    CPU tensor [R_i] per pair. Pairs are packed into micro-batches by length (count × longest ≤ `max_tokens`), or with
    `by_prefix` in token order, so that pairs that begin alike share one (a scorer with `share_prefix` runs it once;
    None: as `score_fn`'s own `share_prefix`).
    `images[i]` (with `vision`): pair i's image sha256s, whose pixels go to the score function with its batch.
    `padding_ids` (with `vision`): the prompt of a padding forward, holding the tokens of one `BLANK_IMAGE`.

    `sync_count(n)` → the largest n over all ranks: under FSDP every forward is a set of collectives, so a rank with
    fewer micro-batches (or none) runs padding forwards until every rank has run the same number."""
    out: list[torch.Tensor | None] = [None] * len(contexts)
    sequences = [list(p) + list(r) for p, r in contexts]
    lengths = [len(seq) for seq in sequences]
    if by_prefix is None:
        by_prefix = shares_prefix(score_fn)
    if by_prefix:
        batches = pack_by_prefix(sequences, lengths, max_tokens)
    else:
        batches = pack_by_length(lengths, max_tokens)
    total = sync_count(len(batches)) if sync_count is not None else len(batches)
    for batch in batches:
        rows = [sequences[i] for i in batch]
        ids, attn = pad_right(rows, pad_id)
        resp = torch.zeros_like(ids, dtype=torch.float32)  # [B, T]
        for b, i in enumerate(batch):
            p, r = len(contexts[i][0]), len(contexts[i][1])
            resp[b, p : p + r] = 1
        extra = {}
        if vision is not None and images is not None and any(images[i] for i in batch):
            extra = {k: v.to(device) for k, v in vision([list(images[i]) for i in batch]).items()}
        logp = score_fn(ids.to(device), attn.to(device), resp.to(device), **extra).float().cpu()  # [B, T]
        for b, i in enumerate(batch):
            p, r = len(contexts[i][0]), len(contexts[i][1])
            out[i] = logp[b, p : p + r].clone()
    for _ in range(total - len(batches)):
        # a padding forward that touches every parameter (lm_head included), like a real micro-batch
        extra = {}
        row = [pad_id, pad_id, pad_id]
        if vision is not None and padding_ids is not None:  # the vision tower runs too, on a blank image
            row = [*padding_ids, pad_id]
            extra = {k: v.to(device) for k, v in vision([[BLANK_IMAGE]]).items()}
        ids, attn = pad_right([row], pad_id)
        resp = torch.zeros(ids.shape, dtype=torch.float32)
        resp[0, -1] = 1.0
        score_fn(ids.to(device), attn.to(device), resp.to(device), **extra)
    return out  # type: ignore[return-value]
