"""The checks: written once over every op spec (generic, the per-arch compile, under
``torch.compile``), the suites that parametrize them, and what they measure against (the
tolerance rule, NaN-poisoned allocations, captured launches)."""
