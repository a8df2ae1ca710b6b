# Sourced by the job scripts: sets OPS to the pytest arguments that select the tests of
# the ops a change touched (ci/select_tests.py), or exits when it touched none.
# FLA_SELECT overrides the selection (all, none, or --fla-ops=...); FLA_BASE is the base to diff.
SELECT=${FLA_SELECT:-$("$PY" ci/select_tests.py --base "${FLA_BASE:-origin/main}" 2>/dev/null || echo all)}
case "$SELECT" in
  none) echo "no op's kernels changed: nothing to check"; exit 0 ;;
  all|repro) OPS=() ;;
  *) OPS=("$SELECT") ;;
esac
