# slurm_down.sh: source with SLURM_DIR SLURM_CONF set (from slurm_up.sh)
scancel --full --signal=KILL --user=root 2>/dev/null; sleep 0.5
for f in "$SLURM_DIR"/slurmd-*.pid "$SLURM_DIR/slurmctld.pid" "$SLURM_DIR/munge/munged.pid"; do
  [ -s "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null
done
rm -rf "$SLURM_DIR"; unset SLURM_CONF
