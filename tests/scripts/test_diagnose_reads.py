"""fw_research.demo.diagnose_reads: the size of each decoder self-attention read by target position, measured where
the read leaves the rule (before --fw-output-gate), on small untrained models in float64: seconds, no training."""
import pytest
import torch

from factories import build_model, random_tokens
from fw_research.demo import diagnose_reads

DELTA = ["--fw-feature-map", "dpfp", "--fw-update-rule", "sum", "--fw-decoder-rule", "delta", "--fw-delta-norm", "sum"]


def messages(dictionary, lengths, seed=0):
    """A split of messages (fairseq's items: source and target ending in eos), targets `lengths` tokens long."""
    g = torch.Generator().manual_seed(seed)
    eos = torch.tensor([dictionary.eos()])
    return [{"source": torch.cat([random_tokens(dictionary, 1, 6, g)[0], eos]),
             "target": torch.cat([random_tokens(dictionary, 1, n - 1, g)[0], eos])} for n in lengths]


def head_norms(model, item):
    """Each decoder layer's self-attention read [T] (the heads' mean norm), from a forward hook on its output
    projection: what the measure must equal where the block has no gate."""
    reads = []
    hooks = [layer.self_attn.out_proj.register_forward_pre_hook(lambda m, args: reads.append(args[0]))
             for layer in model.decoder.layers]
    prev = torch.cat([item["target"][-1:], item["target"][:-1]])
    with torch.no_grad():
        model(item["source"][None], torch.tensor([item["source"].numel()]), prev[None])
    for hook in hooks:
        hook.remove()
    heads = model.decoder.layers[0].self_attn.num_heads
    return [r[:, 0].reshape(r.size(0), heads, -1).norm(dim=-1).mean(-1) for r in reads]


def test_each_bucket_is_the_mean_of_its_positions():
    model, dictionary = build_model(DELTA)
    split = messages(dictionary, [12, 7])
    sizes = diagnose_reads.read_sizes(model, split, limit=2)
    norms = [head_norms(model, item) for item in split]
    for layer, buckets in enumerate(sizes):
        first = torch.cat([norms[0][layer][:5], norms[1][layer][:5]]).mean()
        assert buckets["0-4"] == pytest.approx(float(first), abs=1e-3)
        assert buckets["10-14"] == pytest.approx(float(norms[0][layer][10:].mean()), abs=1e-3)
        assert buckets["15-19"] is None and buckets["45-79"] is None  # no message reaches them


def test_the_read_is_measured_before_the_norm():
    model, dictionary = build_model([*DELTA, "--fw-output-gate", "rms:decoder"])
    sizes = diagnose_reads.read_sizes(model, messages(dictionary, [12]), limit=1)
    head_dim = model.decoder.layers[0].self_attn.head_dim
    # after the norm (weight 1) every head's read has norm sqrt(d_key); before it, the rule's own sizes
    values = [v for layer in sizes for v in layer.values() if v is not None]
    assert all(abs(v - head_dim ** 0.5) > 1e-2 for v in values)


def test_a_missing_checkpoint_stops_with_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit):
        diagnose_reads.main(["--work-dir", str(tmp_path), "--runs", "nothing.s1.u600", "--out", str(tmp_path / "x")])
    assert "--runs nothing.s1.u600: no checkpoint at" in capsys.readouterr().err
