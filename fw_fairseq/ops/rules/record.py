"""An update rule's record (UpdateRule): every form of the rule, in one place.

Everything that runs a rule asks its record: the dispatch (dispatch.py: the CUDA kernel or the chunked
form, the step at T = 1, the memory and the short order of non-causal reads), the attention module, the decoding
state and cache (fw_fairseq/decoding: the lazy cache's write and decay, the in-place step, the CPU kernels'
arguments), the fused GPU read, the CPU kernels' short reads and the synthetic task. None of them asks a rule's
name or which of its scalars are None. A form the rule does not have is None; where nothing else can stand in
for it, `form` refuses in one line naming the rule and the form. rules/<rule>/record.py holds the records,
registry.py the table and `register_rule`.

Shapes, head-first: q, k [B, H, T, E] (already feature-mapped); v [B, H, T, M]; the per-position scalars
(`scalars`, e.g. beta, alpha) [B, H, T] each, in the record's order; state [B, H, E, M]. No scaling or
normalisation happens in the forms: the caller normalises phi where `normalised_phi` (PHI_NORMS) and divides by
the z column where `z_column` (divide_by_z).
"""
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Tuple

from fw_fairseq.ops.rules import dispatch

FORMS = {
    "naive": "the reference loop",
    "chunked": "the causal op off the kernel path",
    "memory": "the non-causal memory off the kernel path",
    "writes": "the effective writes of a whole sequence",
    "write_of": "one position's effective write, for the lazy decoding cache",
    "in_place_step": "generation's step of the state",
}


def no_decay(*scalars):
    """decay_of of a rule whose memory does not decay."""
    return None


class MissingForm(ValueError):
    """A rule asked for a form it does not have."""


@dataclass(frozen=True)
class UpdateRule:
    name: str
    scalars: Tuple[str, ...] = ()  # per-position scalar inputs [B, H, T], in the forms' argument order
    pad_values: Mapping[str, float] = field(default_factory=dict)  # each scalar at a padded position: no write, no decay
    normalised_phi: bool = False  # phi of keys and queries normalised (PHI_NORMS): keeps the delta write contractive
    z_column: bool = False  # values carry a ones column: the state's last column is z = sum phi(k) (divide_by_z)
    # (q, k, v, *scalars, initial_state=None, output_final_state=False) -> (o [B, H, T, M], state or None):
    naive: Optional[Callable] = None  # the literal loop over t, the reference
    chunked: Optional[Callable] = None  # T > 1 off the kernel path (any T where `step` is None)
    step: Optional[Callable] = None  # T = 1 off the kernel path
    memory: Optional[Callable] = None  # (k, v, *scalars) -> the memory of all T positions [B, H, E, M]
    writes: Optional[Callable] = None  # (phi_k, v, *scalars) -> U [B, H, T, M], memory = phi_k^T U
    short_with_grad: bool = False  # the short order (q k^T) U also where autograd records (else only without)
    key_reads: bool = False  # a position's write reads the memory at its own key (its lazy step scores q and k)
    # (v [B, H, 1, M], key_read [B, H, 1, M] or None for an empty memory, *scalars [B, H, 1]) -> u [B, H, 1, M]:
    write_of: Optional[Callable] = None
    decay_of: Callable = no_decay  # (*scalars) -> the memory's decay before each write [B, H, T], or None
    in_place_step: Optional[Callable] = None  # (q, k, v, *scalars, state, order=None, out=None) -> o [B, H, 1, M]
    kernel: Optional[str] = None  # the CUDA extension's {kernel}_forward / _backward / _step, None: none
    kernel_memory: bool = False  # whether the memory runs the causal kernel on CUDA (else `memory` is faster)
    kernel_scalars: Optional[Callable] = None  # (*scalars) -> (beta, alpha) of the CPU decoding kernels, or None
    fused: Optional[Callable] = None  # its fused GPU read from raw heads (rules/<rule>/fused.py)
    # (spec, q, k, v, order, angles, key_padding_mask) -> its non-causal fused read with the aligned cross-attention's
    # weight on the scores (fw_fairseq/modules/cross_align.py), or None
    fused_aligned: Optional[Callable] = None
    short: Optional[Callable] = None  # its short read from raw heads on the CPU kernels (rules/<rule>/short_read.py)

    def form(self, name):
        """The form `name` (a FORMS key), or MissingForm in one line naming the rule and the form."""
        found = getattr(self, name)
        if found is None:
            raise MissingForm(f"update rule {self.name!r} has no {name} form ({FORMS[name]})")
        return found

    def named(self, fn, scalars):
        """{name: tensor} of the positional scalars, checked against the record's."""
        if len(scalars) != len(self.scalars):
            raise ValueError(f"{fn}: update rule {self.name!r} takes {len(self.scalars)} per-position scalars "
                             f"{self.scalars}, got {len(scalars)}")
        return dict(zip(self.scalars, scalars))

    def causal(self, q, k, v, *args, initial_state=None, output_final_state=False):
        """The causal rule over q, k, v and its scalars, (q, k, v, *scalars, initial_state=None,
        output_final_state=False) as its forms take them: (o [B, H, T, M], state [B, H, E, M] or None)."""
        fn, n = f"rule {self.name}", len(self.scalars)
        rest = args[n:]  # initial_state, output_final_state given by position
        if len(rest) > 2:
            raise ValueError(f"{fn}: too many arguments: q, k, v, {', '.join(self.scalars) or 'no scalars'}, "
                             f"initial_state, output_final_state")
        initial_state = rest[0] if rest else initial_state
        output_final_state = rest[1] if len(rest) == 2 else output_final_state
        return dispatch.causal(self, fn, q, k, v, self.named(fn, args[:n]), initial_state, output_final_state)

    def write(self, k, v, *scalars):
        """The non-causal memory of all T positions [B, H, E, M]: the causal state after writing t = 1..T."""
        fn = f"rule {self.name}"
        return dispatch.memory(self, fn, k, v, self.named(fn, scalars))

    def attend(self, q, k, v, *scalars, positions=None):
        """Non-causal attention through the memory: q [B, H, Tq, E] reads write(k, v, *scalars) -> [B, H, Tq, M];
        positions: None or the positional factors of q and k ([B, Tq, R], [B, T, R]; dispatch.attend)."""
        fn = f"rule {self.name}"
        return dispatch.attend(self, fn, q, k, v, self.named(fn, scalars), positions)
