"""Prints torch's intra-op threads: what test_zygote reads from a child of the zygote."""

import torch

print(torch.get_num_threads())
