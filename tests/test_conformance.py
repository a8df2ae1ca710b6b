"""The conformance suite: every generic check over this repo's op specs, which
``conftest.py`` registers through the ``pytest_fla_specs`` hook (``docs/plugin-api.md``).

Ids read ``test_<check>[<op>-<dtype>-<case>]``. Numeric checks run on the GPU, or on the
CPU under ``TRITON_INTERPRET=1`` at the cases' small sizes.
"""

from pytest_fla.conformance import *  # noqa: F401,F403
