"""simple_gla, retention and linear attention, chunked (BT = 64)."""
