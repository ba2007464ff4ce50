"""Chunked log-probs and entropies against the naive full log-softmax on a tiny random Qwen2."""

import pytest
import torch
import torch.nn.functional as F

from seedcli.rl.batching import pack_by_length
from seedcli.rl.logprobs import chunked_entropy, selective_log_softmax, sequence_logprobs

torch.set_num_threads(1)

transformers = pytest.importorskip("transformers")
from tests.helpers_models import tiny_lm  # noqa: E402

VOCAB = 300


@pytest.fixture(scope="module")
def tiny_qwen():
    model = tiny_lm(0, vocab=VOCAB, max_positions=64, tie=False)  # eval mode: two forward passes agree
    return model


@pytest.fixture(scope="module")
def batch():
    """Three left-padded rows of length 12: (input_ids, attention_mask, response_mask), each [3, 12]."""
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, VOCAB, (3, 12), generator=g)
    attention_mask = torch.ones(3, 12, dtype=torch.long)
    attention_mask[1, :3] = 0
    attention_mask[2, :5] = 0
    input_ids[attention_mask == 0] = 0
    response_mask = torch.zeros(3, 12)
    response_mask[0, 6:] = 1
    response_mask[1, 8:11] = 1  # a trailing pad-like token stays unscored
    response_mask[2, 7:] = 1
    return input_ids, attention_mask, response_mask


def naive_scores(model, input_ids, attention_mask, response_mask):
    """The reference: full fp32 logits and log-softmax over every position, [B, T] each."""
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits.float()
    logp_all = F.log_softmax(logits[:, :-1], dim=-1)  # [B, T-1, V]
    logp = torch.zeros(input_ids.shape)
    logp[:, 1:] = logp_all.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    entropy = torch.zeros(input_ids.shape)
    entropy[:, 1:] = -(logp_all.exp() * logp_all).sum(-1)
    return logp * response_mask, entropy * response_mask


# --- selective_log_softmax / chunked_entropy -------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_selective_log_softmax_matches_naive_with_gradient(dtype):
    torch.manual_seed(0)
    logits = (3 * torch.randn(2, 7, 50, dtype=dtype)).requires_grad_()
    index = torch.randint(0, 50, (2, 7))
    out = selective_log_softmax(logits, index, chunk_rows=3)
    ref = F.log_softmax(logits, -1).gather(-1, index[..., None]).squeeze(-1)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    weights = torch.randn(2, 7, dtype=dtype)
    (grad,) = torch.autograd.grad((out * weights).sum(), logits)
    (grad_ref,) = torch.autograd.grad((ref * weights).sum(), logits)
    torch.testing.assert_close(grad, grad_ref, atol=1e-5, rtol=0)


def test_selective_log_softmax_bf16_stays_bf16_and_close():
    torch.manual_seed(0)
    logits = 3 * torch.randn(2, 7, 50)
    index = torch.randint(0, 50, (2, 7))
    out = selective_log_softmax(logits.bfloat16(), index, chunk_rows=4)
    ref = F.log_softmax(logits.bfloat16().float(), -1).gather(-1, index[..., None]).squeeze(-1)
    assert out.dtype == torch.bfloat16
    # bf16 keeps 8 significant bits: log-probs of size ~10 round to within ~0.05
    torch.testing.assert_close(out.float(), ref, atol=0.1, rtol=0.01)


def test_chunked_entropy_matches_naive_with_gradient():
    torch.manual_seed(0)
    logits = (2 * torch.randn(3, 5, 40)).requires_grad_()
    out = chunked_entropy(logits, chunk=4)
    logp = F.log_softmax(logits, -1)
    ref = -(logp.exp() * logp).sum(-1)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    (grad,) = torch.autograd.grad(out.sum(), logits)
    (grad_ref,) = torch.autograd.grad(ref.sum(), logits)
    torch.testing.assert_close(grad, grad_ref, atol=1e-5, rtol=0)


def test_chunked_entropy_by_hand():
    # uniform over 4 tokens: log 4; one-hot (in the limit): 0
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, -1e4, -1e4, -1e4]])
    assert chunked_entropy(logits).tolist() == pytest.approx([torch.log(torch.tensor(4.0)).item(), 0.0], abs=1e-6)


# --- sequence_logprobs -----------------------------------------------------------------------------------


def test_sequence_logprobs_matches_naive_without_grad(tiny_qwen, batch):
    input_ids, attention_mask, response_mask = batch
    with torch.no_grad():
        logp, entropy = sequence_logprobs(
            tiny_qwen, input_ids, attention_mask, response_mask, with_entropy=True, chunk_tokens=4
        )
        ref_logp, ref_entropy = naive_scores(tiny_qwen, input_ids, attention_mask, response_mask)
    assert logp.shape == (3, 12) and logp.dtype == torch.float32
    assert logp.grad_fn is None
    torch.testing.assert_close(logp, ref_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy, ref_entropy, atol=1e-5, rtol=0)
    assert (logp[response_mask == 0] == 0).all()
    assert (logp[response_mask == 1] < 0).all()


def test_sequence_logprobs_gradients_match_naive(tiny_qwen, batch):
    input_ids, attention_mask, response_mask = batch
    params = [p for p in tiny_qwen.parameters() if p.requires_grad]
    weights = torch.randn(3, 12, generator=torch.Generator().manual_seed(2))

    logp, entropy = sequence_logprobs(
        tiny_qwen, input_ids, attention_mask, response_mask, with_entropy=True, chunk_tokens=5
    )
    grads = torch.autograd.grad((logp * weights).sum() - 0.3 * entropy.sum(), params)
    ref_logp, ref_entropy = naive_scores(tiny_qwen, input_ids, attention_mask, response_mask)
    ref_grads = torch.autograd.grad((ref_logp * weights).sum() - 0.3 * ref_entropy.sum(), params)

    torch.testing.assert_close(logp.detach(), ref_logp.detach(), atol=1e-5, rtol=0)
    for (name, _), g, g_ref in zip(tiny_qwen.named_parameters(), grads, ref_grads, strict=True):
        torch.testing.assert_close(g, g_ref, atol=1e-5, rtol=1e-4, msg=lambda m, name=name: f"{name}: {m}")
    assert any(g.abs().sum() > 0 for g in grads)


def test_left_padding_scores_like_no_padding(tiny_qwen, batch):
    input_ids, attention_mask, response_mask = batch
    with torch.no_grad():
        padded = sequence_logprobs(tiny_qwen, input_ids, attention_mask, response_mask)
        alone = sequence_logprobs(
            tiny_qwen, input_ids[2:, 5:], attention_mask[2:, 5:], response_mask[2:, 5:], chunk_tokens=2
        )
    torch.testing.assert_close(padded[2:, 5:], alone, atol=1e-5, rtol=0)


def test_first_position_and_empty_response_are_zero(tiny_qwen, batch):
    input_ids, attention_mask, _ = batch
    only_first = torch.zeros(3, 12)
    only_first[:, 0] = 1
    with torch.no_grad():
        assert torch.equal(sequence_logprobs(tiny_qwen, input_ids, attention_mask, only_first), torch.zeros(3, 12))
        logp, entropy = sequence_logprobs(tiny_qwen, input_ids, attention_mask, torch.zeros(3, 12), with_entropy=True)
    assert torch.equal(logp, torch.zeros(3, 12)) and torch.equal(entropy, torch.zeros(3, 12))


def test_sequence_logprobs_through_peft_lora(tiny_qwen, batch):
    peft = pytest.importorskip("peft")
    import copy

    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = peft.get_peft_model(copy.deepcopy(tiny_qwen), config)
    input_ids, attention_mask, response_mask = batch
    lora = [p for n, p in model.named_parameters() if p.requires_grad]
    assert lora and all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)

    logp = sequence_logprobs(model, input_ids, attention_mask, response_mask, chunk_tokens=3)
    (grads,) = [torch.autograd.grad(logp.sum(), lora)]
    ref_logp, _ = naive_scores(model, input_ids, attention_mask, response_mask)
    ref_grads = torch.autograd.grad(ref_logp.sum(), lora)
    torch.testing.assert_close(logp.detach(), ref_logp.detach(), atol=1e-5, rtol=0)
    for g, g_ref in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, g_ref, atol=1e-5, rtol=1e-4)
    with torch.no_grad():
        base_logp, _ = naive_scores(tiny_qwen, input_ids, attention_mask, response_mask)
    assert (logp.detach() - base_logp).abs().max() > 1e-3  # the adapters are live, not bypassed


# --- pack_by_length ----------------------------------------------------------------------------------------


def test_pack_by_length_by_hand():
    # longest first: 8 alone (2·8 > 10), then 5 + 3 (2·5 = 10), then 2 + 1
    assert pack_by_length([5, 1, 3, 8, 2], max_tokens=10) == [[3], [0, 2], [4, 1]]


def test_pack_by_length_oversized_sample_gets_its_own_batch():
    assert pack_by_length([20, 3, 3], max_tokens=10) == [[0], [1, 2]]


def test_pack_by_length_covers_every_index_within_budget():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 100, (200,), generator=g).tolist()
    batches = pack_by_length(lengths, max_tokens=512)
    assert sorted(i for b in batches for i in b) == list(range(200))
    for b in batches:
        assert len(b) * max(lengths[i] for i in b) <= 512
    # packing beats padding everything to the longest sample
    assert len(batches) < -(-200 // (512 // max(lengths)))


def test_pack_by_length_rejects_nonpositive_budget():
    with pytest.raises(ValueError, match="max_tokens"):
        pack_by_length([1], max_tokens=0)


def test_hand_written_backward_passes_gradcheck():
    from seedcli.rl.logprobs import _TokenScores

    torch.manual_seed(0)
    logits = torch.randn(4, 9, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([0, 3, 8, 3])
    assert torch.autograd.gradcheck(lambda x: _TokenScores.apply(x, targets, True), (logits,))
    assert torch.autograd.gradcheck(lambda x: _TokenScores.apply(x, targets, False)[0], (logits,))


def test_entropy_requested_but_unused_leaves_logp_gradient_unchanged(tiny_qwen, batch):
    input_ids, attention_mask, response_mask = batch
    params = list(tiny_qwen.parameters())
    logp, _ = sequence_logprobs(tiny_qwen, input_ids, attention_mask, response_mask, with_entropy=True)
    grads = torch.autograd.grad(logp.sum(), params)
    ref_logp, _ = naive_scores(tiny_qwen, input_ids, attention_mask, response_mask)
    ref_grads = torch.autograd.grad(ref_logp.sum(), params)
    for g, g_ref in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, g_ref, atol=1e-5, rtol=1e-4)
