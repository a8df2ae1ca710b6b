"""How a library's ``@triton.autotune`` picks its config in a run (``--fla-autotune``).

``tuned`` (the default on a GPU): Triton's own autotuning, each config of each key timed.

``first``: the first config that survives the library's pruning and runs, none timed.
Under Triton's CPU interpreter this is the only choice: the autotuner times configs with
the active driver's benchmarker, the interpreter has none, and a kernel with several
configs raises "0 active drivers" on the CPU (Triton 3.6 to 3.9), though it runs there with
any one of them. On a GPU it is a choice, for two reasons:

- time: a library that tunes tens of configs per kernel and key compiles each of them
  before its first result (tens of seconds per op on an H200, most of a run over the peer
  library's releases); ``first`` compiles one per key;
- a verdict that holds: the config a timed autotuner picks can change from run to run
  (timings a few percent apart), and a defect in one config then shows in one run and not
  the next (fla-core 0.5.2's conv backward at a short sequence failed one H200 run and
  passed another); the first config is the same in every run, and the same config the
  interpreter checks on the CPU.

A config that fails to compile or does not fit the device (what the autotuner itself
skips: out of resources, a compile-time assertion, ptxas) is skipped here too, and the
next one is tried. A defect that shows only in a config other than the first is not seen:
run ``tuned`` for that.
"""

from __future__ import annotations

import functools

CHOICES = ("tuned", "first")
EQUAL_TIMES = [0.0, 0.0, 0.0]  # the quantiles (0.5, 0.2, 0.8) the autotuner asks for
NOT_TRIED = [float("inf")] * 3  # what a config after the one chosen reads as: never picked


def _untimed(kernel_call, quantiles):
    return list(EQUAL_TIMES[: len(quantiles)]) if quantiles else 0.0


def install_untimed() -> bool:
    """Under the interpreter: every config takes the same time, none is run to time it.
    The autotuner keeps its pruning, its hooks and its choice by key, and picks the first
    config left. False where this Triton's autotuner has not the shape patched."""
    Autotuner = _autotuner()
    if Autotuner is None:
        return False
    Autotuner.do_bench = property(lambda self: _untimed)
    return True


def install_first_that_runs() -> bool:
    """On a GPU: each autotuning pass runs its configs in order, once each, until one runs;
    that one reads as fastest, the rest as never tried (not compiled). The pass is not
    written to Triton's on-disk autotuning cache, where a tuned run would read it as timed.
    False where this Triton's autotuner has not the shape patched."""
    Autotuner = _autotuner()
    if Autotuner is None or not hasattr(Autotuner, "prune_configs"):
        return False
    if getattr(Autotuner, "_fla_first_that_runs", False):
        return True
    prune = Autotuner.prune_configs

    @functools.wraps(prune)
    def prune_configs(self, kwargs):
        configs = prune(self, kwargs)
        self._fla_chosen = False  # a new pass: run() prunes once before it benches each config
        self.cache_results = False
        return configs

    def first_that_runs(self):
        def bench(kernel_call, quantiles):
            if getattr(self, "_fla_chosen", False):
                return list(NOT_TRIED[: len(quantiles)]) if quantiles else NOT_TRIED[0]
            kernel_call()  # a config that cannot compile or fit raises here, and the autotuner skips it
            self._fla_chosen = True
            return _untimed(kernel_call, quantiles)

        return bench

    Autotuner.prune_configs = prune_configs
    Autotuner.do_bench = property(first_that_runs)
    Autotuner._fla_first_that_runs = True
    return True


def _autotuner():
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError:
        return None
    return Autotuner if hasattr(Autotuner, "do_bench") else None
