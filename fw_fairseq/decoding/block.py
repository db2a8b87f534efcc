"""What an attention block computes, as its reads and its decoding steps ask it: the rule's record, the feature map,
phi's normalisation and what a decoding cache keeps of a key. Built once per block (FastWeightAttention); every
decision about the rule is its record's (fw_fairseq/ops/rules/record.py), none is inferred from the scalars."""
from typing import NamedTuple, Optional

from torch import Tensor

from fw_fairseq.decoding.key_cache import FeatureKeys, key_cache
from fw_fairseq.ops import FeatureMap, UpdateRule, append_z_column, divide_by_z


class Block(NamedTuple):
    rule: UpdateRule
    phi: FeatureMap
    norm: Optional[str]  # phi's normalisation of keys and queries (--fw-delta-norm) where the rule has one, else None
    keys: FeatureKeys  # what the lazy cache keeps of a key (key_cache.py)

    def features(self, heads: Tensor, is_query: bool) -> Tensor:
        """heads [B, H, T, d] -> phi [B, H, T, E], normalised where the rule says so."""
        if self.norm is None:
            return self.phi(heads, is_query=is_query)
        return self.phi.normalized(heads, is_query, self.norm)

    def values(self, v: Tensor, key_padding_mask: Optional[Tensor]) -> Tensor:
        """The values [B, H, S, D] as the rule writes them: with the z column (0 at padded positions) where it has
        one -> [B, H, S, D (+ 1)]."""
        return append_z_column(v, key_padding_mask) if self.rule.z_column else v

    def read_out(self, o: Tensor) -> Tensor:
        """A read [B, H, T, D (+ 1)] of the values as written -> the attention's output [B, H, T, D]."""
        return divide_by_z(o) if self.rule.z_column else o

    @classmethod
    def of(cls, rule, phi, delta_norm: str) -> "Block":
        """The Block of a rule's record and a map, phi normalised by `delta_norm` where the rule normalises it."""
        return cls(rule, phi, delta_norm if rule.normalised_phi else None, key_cache(phi))

