"""The one lazy import of Triton for the fused read: a machine without it loses the fused read and nothing else.

The rules' fused forms (rules/<rule>/fused.py, named by each record's `fused`) import their kernels at their
first call, which dispatch.takes allows only where `kernels()` is.
"""
import logging

logger = logging.getLogger(__name__)
_launch = None  # the launch module once imported, False where Triton is missing


def kernels():
    """The kernels' launch module (launch.py: block shapes, checks, MapSpec), or False where Triton cannot be
    imported."""
    global _launch
    if _launch is None:
        try:
            from fw_fairseq.ops.fused_read import launch
            _launch = launch
        except ImportError as err:
            logger.warning("the fused GPU read is not available (%s): phi is formed in memory instead", err)
            _launch = False
    return _launch
