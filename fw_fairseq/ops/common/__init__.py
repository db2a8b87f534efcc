"""What every op and rule shares: the dtype and autograd guards, chunking, the custom-op machinery, the short
order of non-causal reads and its Function, the z column, the small products of the T = 1 steps."""
