"""Incremental decoding of FastWeightAttention (fairseq's incremental_state: generation and teacher-forced tests).

- steps.py: the entries, one per place: the decoder self-attention's step and the cross-attention's;
- block.py: what a block computes (its rule's record, its map, phi's normalisation, what its cache keeps of a key);
- backend.py: the compiled CPU kernels or PyTorch ops, chosen once per step;
- key_cache.py: what the lazy cache keeps of a key, per map, and how it scores rows against it;
- decoder_state.py: the self-attention's lazy cache of keys and writes, folded into the state once that is cheaper;
- source_memory.py: the cross-attention's cached source, one row per sentence of beams;
- buffer_order.py, cache_storage.py: beam search's reorders and the storages that spare generation an allocation
  per step.
Decoding asks fw_fairseq.ops for every piece of maths (the rules' records, the maps, the kernels); ops never imports
decoding.
"""
