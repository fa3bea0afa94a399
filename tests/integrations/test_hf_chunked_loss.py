"""fp8mp.integrations.hf.use_chunked_loss on a tiny LlamaForCausalLM: the same loss and gradients as transformers'
own loss, the saved-for-backward bytes without the [tokens, vocab] fp32 logits (fp8mp.memory.saved_tensors), the
model's own forward without labels and after restore_loss, and the heads it refuses."""
from __future__ import annotations

import pytest
import torch

from fp8mp.memory.saved_tensors import saved_tensor_bytes


def tiny_llama(vocab=512, tied=True):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                      intermediate_size=128, vocab_size=vocab, max_position_embeddings=64,
                                      tie_word_embeddings=tied, attn_implementation="sdpa")
    return transformers.LlamaForCausalLM(config)


def test_hf_llama_same_loss_and_gradients_and_no_fp32_logits_saved():
    import fp8mp.integrations.hf as fp8_hf

    vocab, batch, seq = 512, 2, 48
    model = tiny_llama(vocab).to(torch.bfloat16)
    ids = torch.randint(vocab, (batch, seq), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[:, :5] = -100

    def step():
        model.zero_grad()
        out = model(input_ids=ids, labels=labels)
        out.loss.backward()
        return out, [p.grad.clone() for p in model.parameters()]

    saved_before = saved_tensor_bytes(lambda: model(input_ids=ids, labels=labels).loss)["total"]
    (plain, plain_grads) = step()
    fp8_hf.use_chunked_loss(model, chunk_tokens=20)
    saved_after = saved_tensor_bytes(lambda: model(input_ids=ids, labels=labels).loss)["total"]
    (chunked, chunked_grads) = step()
    assert chunked.logits is None and plain.logits is not None
    assert (chunked.loss - plain.loss).abs() <= 1e-5 * plain.loss.abs()  # fp32 logits and loss in both
    for a, b in zip(chunked_grads, plain_grads):  # bf16 gradients: within bf16 rounding of the sums
        assert (a.float() - b.float()).abs().max() <= 2e-2 * b.float().abs().max()
    tokens = batch * seq
    # transformers keeps the fp32 log-softmax of every token (4 bytes x tokens x vocab) and more; the chunked loss
    # keeps per token a log-sum-exp (fp32), a target (int64) and a valid flag (bool) beside the head's input
    assert saved_before - saved_after >= 4 * tokens * vocab - (4 + 8 + 1) * tokens - 64
    assert model(input_ids=ids).logits.shape == (batch, seq, vocab)  # without labels: the model's own forward
    fp8_hf.restore_loss(model)
    assert model(input_ids=ids, labels=labels).logits is not None


def test_hf_wiring_refuses_a_head_it_cannot_chunk():
    import fp8mp
    import fp8mp.integrations.hf as fp8_hf

    with pytest.raises(TypeError, match="'model'"):
        fp8_hf.use_chunked_loss(torch.nn.Linear(2, 2))
    model = tiny_llama()
    model.lm_head = fp8mp.nn.Linear(64, 512, bias=False)
    model.config.tie_word_embeddings = False
    with pytest.raises(TypeError, match="plain torch.nn.Linear head"):
        fp8_hf.use_chunked_loss(model)


@pytest.mark.parametrize("tied", [False, True])
def test_step_in_backward_takes_an_untied_head_in_row_blocks_and_a_tied_one_whole(tied):
    """With fp8mp.step_in_backward the untied head's gradient comes a block of vocabulary rows at a time (and the
    sparse embedding's is made dense a block at a time): the most gradient bytes held at once fall below the
    head's gradient; a head tied to the embedding keeps its whole gradient (its two parts meet in .grad)."""
    import fp8mp
    import fp8mp.integrations.hf as fp8_hf

    vocab, hidden = 512, 64
    model = fp8_hf.use_chunked_loss(tiny_llama(vocab, tied=tied).to(torch.bfloat16), chunk_tokens=20)
    model.get_input_embeddings().sparse = not tied
    ids = torch.randint(vocab, (2, 24), generator=torch.Generator().manual_seed(1))
    stepper = fp8mp.step_in_backward(fp8mp.optim.AdamW(model.parameters(), lr=1e-3), max_grad_block_bytes=8192)
    head = model.get_output_embeddings().weight.detach().clone()
    assert stepper.backward(model(input_ids=ids, labels=ids).loss)
    assert not torch.equal(head, model.get_output_embeddings().weight)
    head_grad = 2 * vocab * hidden
    assert stepper.peak_grad_bytes == head_grad if tied else stepper.peak_grad_bytes < head_grad
