"""Describing ops as data: the op spec, its inputs and error inputs, the variable-length
packings, the builders that make a spec from an argument declaration, and the session's
registry of specs."""
