"""The environment variables the plugin reads or sets: the one place their names are spelt.

The run's state (its targets, this process's target, the options) lives on the config
(``plugin.RunState``, ``targets.run_target``); a value is an environment variable only
where the config cannot carry it. Each one below says which of these it is:

* before import: it must be in place before torch or triton is imported (Triton reads
  ``TRITON_INTERPRET`` as ``@triton.jit`` runs, the CUDA driver ``CUDA_VISIBLE_DEVICES`` at
  its first call), which is before a worker's or a child's config exists;
* crosses: it reaches a process that is no pytest session of this run (a reproducer run as
  a script, a child under compute-sanitizer, a fleet host's probe, a mutant's pytest);
* switch: a user-facing switch, for a setting that has no command-line option.

``docs/design.md`` ("Environment variables") has the table of these and of the variables
of the CI and benchmark scripts; ``tests/plugin/test_environment.py`` holds the two
together. This module imports nothing.
"""

from __future__ import annotations

# -- a process's arch target (targets.target_environment) -------------------------------
# before import, crosses: the target a worker, child or reproducer runs, as ``name:mode``
# (targets.current_target decodes it where no session is configured yet)
RUN_TARGET = "FLA_RUN_TARGET"
# before import, crosses: the arch whose configs and limits the kernels pick (kernels/_arch.py
# reads it; the library knows nothing of the plugin)
TARGET_ARCH = "FLA_TARGET_ARCH"
# switch: where the per-target Triton caches go (default ~/.triton/cache/fla-<target>)
TRITON_CACHE_BASE = "FLA_TRITON_CACHE_BASE"

# -- spreading a run over processes (running/distribute.py, running/fleet.py) --------------
# before import: the controller's visible GPUs; a worker pins itself to one of them before
# the driver starts, before xdist hands it its workerinput
GPUS = "FLA_GPUS"
# crosses: ``k/n``, the share of its target's tests a worker runs, set in its xdist gateway's
# environment with the target's variables
SHARD = "FLA_SHARD"
# crosses: the host a fleet worker runs on, set in its gateway (report.annotate reads it)
FLEET_HOST = "FLA_FLEET_HOST"
# switch, crosses: in a gateway's environment, the GPUs that host stands in for (the fleet's
# test hook); the host's probe, which is no pytest session, reads it
FLEET_STAND_IN = "FLA_FLEET_STAND_IN"

# -- what a test process does ------------------------------------------------------------
# switch, crosses: ``1``: every case at its small dims on a GPU too (--fla-small-shapes; under
# the sanitizer, in its children)
SMALL_SHAPES = "FLA_SMALL_SHAPES"
# crosses: the device the float64 reference runs on (``cpu`` in a child under the sanitizer)
REFERENCE_DEVICE = "FLA_REFERENCE_DEVICE"
# crosses: ``1``: an isolation child counts each test's Triton launches (under the sanitizer)
COUNT_LAUNCHES = "FLA_COUNT_LAUNCHES"
# switch, crosses: a file every timed process (children included) appends its compiles to
COMPILE_LOG = "FLA_COMPILE_LOG"
# switch: moves this run's compute-sanitizer ports, for two runs side by side on one machine
SANITIZER_PORT_OFFSET = "FLA_SANITIZER_PORT_OFFSET"
# crosses: ``first`` under --fla-autotune=first, for the children and reproducers a process
# starts (read as that option's default)
AUTOTUNE = "FLA_AUTOTUNE"
# crosses: the session's library switches (JSON), for a reproducer run as a plain script
LIBRARY_SWITCHES = "FLA_LIBRARY_SWITCHES"

# -- the interpreter's patches (targets/, sanitizer/interpreter.py) ----------------------
# crosses: ``1``: bf16 is checked under the interpreter (--fla-bf16-emulated); kernels/_arch.py
# reads it, in this process and in the children it starts
INTERPRETER_BF16 = "FLA_INTERPRETER_BF16"
# switch: ``1``: Triton's own patching of helper calls, not the plugin's shortcut
INTERPRETER_REPATCH = "FLA_INTERPRETER_REPATCH"
# switch: ``0``: the interpreter's bounds and store checks off
INTERPRETER_MEMCHECK = "FLA_INTERPRETER_MEMCHECK"

# -- tolerances' error ratchet (checks/tolerance.py) -------------------------------------
# switch, crosses: a file every comparison appends its measured errors to
RECORD_ERRORS = "FLA_RECORD_ERRORS"
# switch, crosses: a file of recorded errors that every comparison is held to
ERROR_BASELINE = "FLA_ERROR_BASELINE"

# -- a mutant's pytest (mutation/child.py, started by mutation/runner.py and command.py) --
# crosses: where a collect-only child writes the mutation sites of the session's specs
MUTATION_SITES = "FLA_MUTATION_SITES"
# crosses: the ops whose sites that child lists
MUTATION_OPS = "FLA_MUTATION_OPS"
# crosses: the device that child traces the ops' launches on
MUTATION_DEVICE = "FLA_MUTATION_DEVICE"
# crosses: the workspace root the sites' paths are relative to
MUTATION_ROOT = "FLA_MUTATION_ROOT"
# crosses: the mutated file, whose import the child reports
MUTATION_FILE = "FLA_MUTATION_FILE"
# crosses: where the child writes its first failing test
MUTATION_VERDICT = "FLA_MUTATION_VERDICT"
