# Sourced by the GPU scripts that run grids on a host's CPU cores through experiments/run_points.py:
# wait up to WAIT_S seconds since t0 for the detached runner, report its count of finished and
# failed points, and pack each grid folder of EXPS into $OUT/<exp>.tgz (what finished comes back
# even if the machine is then given back).
while pgrep -f "experiments.run_points" >/dev/null && [ $(( $(date +%s) - t0 )) -lt "$WAIT_S" ]; do
  sleep 10
done
echo "runner alive: $(pgrep -f experiments.run_points >/dev/null && echo yes || echo no); $(grep -c '^ok' outputs/run_points.log) ok, $(grep -c '^FAIL' outputs/run_points.log) failed"
tail -n 5 outputs/run_points.log
for e in $EXPS; do
  [ -d "outputs/$e" ] && tar czf "$OUT/$e.tgz" "outputs/$e"
done
