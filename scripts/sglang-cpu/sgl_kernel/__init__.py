"""Minimal pure-torch stand-in for the CPU build of sgl-kernel (test rig only).

Only what a tiny dense model needs on the non-AMX fallback path is implemented;
everything else raises NotImplementedError when called.
"""

import torch

__version__ = "0.0.0+stub"


def assign_req_to_token_pool_cpu(
    req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len
):
    off = 0
    for i in range(req_pool_indices.shape[0]):
        s = int(start_offset[i])
        e = int(end_offset[i])
        n = e - s
        req_to_token[int(req_pool_indices[i]), s:e] = out_cache_loc[off : off + n].to(
            req_to_token.dtype
        )
        off += n


def _unimpl(name):
    def f(*a, **k):
        raise NotImplementedError(f"sgl_kernel stub: {name} not implemented")

    f.__name__ = name
    return f


for _n in [
    "copy_all_layer_kv_cache_cpu",
    "rotate_input_ids_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "build_tree_kernel_efficient_cpu",
    "verify_tree_greedy_cpu",
]:
    globals()[_n] = _unimpl(_n)
