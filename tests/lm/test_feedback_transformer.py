"""feedback_transformer_lm: the memory against a naive loop of its definition, cached decoding."""
import math

import pytest
import torch

from factories import build_lm, decode_step_by_step, random_tokens

SMALL = ["--decoder-layers", "3", "--decoder-embed-dim", "16", "--decoder-attention-heads", "2",
         "--decoder-ffn-embed-dim", "24", "--tokens-per-sample", "5"]  # 5: distances get clamped


def randomise(model, seed=1):
    """Random non-zero relative keys, query bias and layer weights, so the test sees them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "rel_key" in name or "query_bias" in name or "memory_mix" in name:
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))


def naive_feedback(decoder, tokens):
    """The definition, step by step and memory vector by memory vector, with no caching.

    h_t^0 = embedding; h_t^l = layer l reading m_0..m_{t-1} (none at t = 0) with scores
    (q + u) . (K m_s + r_{min(t-s, P)}) / sqrt(d); m_t = sum_l softmax(w)_l h_t^l.
    Returns the logits [B, T, V] and the memory [B, T, C].
    """
    mix = torch.softmax(decoder.memory_mix.weights, dim=0)
    memory, outputs = [], []
    for t in range(tokens.size(1)):
        h = decoder.embed_scale * decoder.embed_tokens(tokens[:, t])
        layer_outputs = [h]
        for layer in decoder.layers:
            attn = layer.attn
            if t > 0:
                z = layer.attn_norm(h)
                heads = []
                for head in range(attn.num_heads):
                    sl = slice(head * attn.head_dim, (head + 1) * attn.head_dim)
                    q = attn.q_proj(z)[:, sl] + attn.query_bias[head]
                    scores = torch.stack([
                        (q * (attn.k_proj(m)[:, sl]
                              + attn.rel_key[min(t - s, attn.max_distance) - 1, head])).sum(-1)
                        for s, m in enumerate(memory)], dim=-1) / math.sqrt(attn.head_dim)
                    p = torch.softmax(scores, dim=-1)
                    heads.append(sum(p[:, s:s + 1] * attn.v_proj(m)[:, sl]
                                     for s, m in enumerate(memory)))
                h = h + attn.out_proj(torch.cat(heads, dim=-1))
            h = h + layer.fc2(torch.relu(layer.fc1(layer.ffn_norm(h))))
            layer_outputs.append(h)
        memory.append(sum(w * o for w, o in zip(mix, layer_outputs)))
        outputs.append(h)
    logits = decoder.output_layer(decoder.layer_norm(torch.stack(outputs, dim=1)))
    return logits, torch.stack(memory, dim=1)


@pytest.fixture(scope="module")
def model_and_dict():
    model, d = build_lm("feedback_transformer_lm_tiny", SMALL)
    randomise(model)
    return model, d


def test_memory_and_outputs_match_the_naive_definition(model_and_dict):
    model, d = model_and_dict
    tokens = random_tokens(d, 2, 8, torch.Generator().manual_seed(2))
    logits, extra = model(tokens)
    ref_logits, ref_memory = naive_feedback(model.decoder, tokens)
    torch.testing.assert_close(extra["memory"], ref_memory, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-10, atol=1e-10)


def test_cached_decoding_equals_full_forward(model_and_dict):
    model, d = model_and_dict
    tokens = random_tokens(d, 3, 9, torch.Generator().manual_seed(3))
    full, _ = model(tokens)
    torch.testing.assert_close(decode_step_by_step(model, tokens), full, rtol=1e-10, atol=1e-10)


def test_reorder_equals_decoding_the_permuted_batch(model_and_dict):
    model, d = model_and_dict
    tokens = random_tokens(d, 4, 6, torch.Generator().manual_seed(4))
    new_order = torch.tensor([2, 0, 0, 3])
    state = {}
    for t in range(3):
        model.decoder(tokens[:, : t + 1], incremental_state=state)
    model.decoder.reorder_incremental_state_scripting(state, new_order)
    tail = [model.decoder(tokens[new_order, : t + 1], incremental_state=state)[0]
            for t in range(3, 6)]
    full, _ = model(tokens[new_order])
    torch.testing.assert_close(torch.cat(tail, dim=1), full[:, 3:], rtol=1e-10, atol=1e-10)

