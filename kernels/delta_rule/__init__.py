"""Delta-rule family: chunked (``chunk.py``) forms of the delta rule and the gated delta rule."""
