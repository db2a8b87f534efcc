"""fw_lm_stream: ordered parallel streams, and the state the task carries between its batches."""
from types import SimpleNamespace

import numpy as np
import torch

from factories import build_lm
from fw_fairseq.tasks.language_modeling_stream import StreamLanguageModelingTask, StreamSegments


def stream_of(tokens):
    return SimpleNamespace(name="train", tokens=np.asarray(tokens, dtype=np.int32))


def test_batches_continue_each_stream_and_targets_are_shifted():
    segments = StreamSegments(stream_of(range(100, 123)), bsz=2, seg_len=4)  # rows of 11
    batches = [segments.collater([segments[i]]) for i in range(len(segments))]
    assert [b["segment"] for b in batches] == [0, 1, 2]
    source = torch.cat([b["net_input"]["src_tokens"] for b in batches], dim=1)
    target = torch.cat([b["target"] for b in batches], dim=1)
    assert source.tolist() == [list(range(100, 110)), list(range(111, 121))]
    assert torch.equal(target, source + 1)
    assert batches[-1]["ntokens"] == 2 * 2 and batches[0]["id"].tolist() == [0, 1]


def test_task_carries_state_across_batches_like_one_long_sequence():
    model, d = build_lm("transformer_lm_fw_tiny", ["--no-token-positional-embeddings"])
    rng = np.random.default_rng(0)
    stream = stream_of(rng.integers(d.nspecial, len(d), size=2 * 13))
    segments = StreamSegments(stream, bsz=2, seg_len=4)
    task = SimpleNamespace(args=SimpleNamespace(fw_carry_state=True), carried={})
    pieces = []
    for i in range(len(segments)):
        sample = segments.collater([segments[i]])
        StreamLanguageModelingTask.attach_state(task, sample)
        pieces.append(model(**sample["net_input"])[0])
    full, _ = model(segments.rows[:, :-1])
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-9, atol=1e-9)
    # a new pass over the split starts from empty fast weights again
    sample = segments.collater([segments[0]])
    StreamLanguageModelingTask.attach_state(task, sample)
    torch.testing.assert_close(model(**sample["net_input"])[0], full[:, :4], rtol=1e-9, atol=1e-9)
