"""The machinery shared by the ops' torch.library custom ops (torch.compile's view of a Function with a hand-written
backward): a Function's ctx outside autograd, the op's registration with itself as its fake implementation, and the
packing of results that may be None (custom ops return no None) into a list and back.
"""
import torch


class Context:
    """A Function's ctx outside autograd: keeps what its forward saves and hands it to its backward."""

    def __init__(self, saved=(), **attributes):
        self.saved_tensors = saved
        self.__dict__.update(attributes)

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors

    def set_materialize_grads(self, value):
        """The custom ops' autograd decides this (setup_context)."""


def custom_op(name, function):
    """fw_fairseq::name running `function`, whose fake implementation is `function` itself on fake tensors."""
    op = torch.library.custom_op(f"fw_fairseq::{name}", function, mutates_args=())
    op.register_fake(function)
    return op


def present(tensors):
    return [x for x in tensors if x is not None]


def unpack(results, there):
    """The op's list back to its slots: `there` says, slot by slot, whether it holds a tensor."""
    results = iter(results)
    return [next(results) if slot else None for slot in there]
