"""DPLR delta rule and RWKV-7: a diagonal-plus-rank-one transition, chunked and recurrent."""
