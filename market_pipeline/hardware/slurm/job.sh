#!/bin/bash
# A workload job of the local Slurm cluster: works MP_DURATION seconds in 0.2 s steps.
# Checkpointable jobs (MP_CHECKPOINT=1) keep their step in $MP_CKPT_DIR/<job>.ckpt:
#   USR1 (drain warning) and TERM write it, USR2 writes it and acknowledges in the job's
#   comment (checkpoint=<n>), and a requeued run resumes from it. Until the job has set
#   checkpoint=0 (its handlers installed) it gets no USR1/USR2, whose default is to kill it.
step=0 ckpts=0
ckpt="$MP_CKPT_DIR/$SLURM_JOB_ID.ckpt"
log="$MP_CKPT_DIR/$SLURM_JOB_ID.log"
steps=$(( MP_DURATION * 5 ))
note() { echo "$(date -u +%FT%T.%3NZ) run=${SLURM_RESTART_COUNT:-0} node=$SLURMD_NODENAME $*" >>"$log"; }
save() { echo "$step" >"$ckpt.tmp" && mv "$ckpt.tmp" "$ckpt"; note "checkpoint step=$step ($1)"; }
if [[ ${MP_CHECKPOINT:-0} == 1 ]]; then
  [[ -s $ckpt ]] && step=$(cat "$ckpt") && note "resume step=$step"
  trap 'save warning' USR1
  trap 'save request; ckpts=$((ckpts + 1)); scontrol update jobid="$SLURM_JOB_ID" comment="kind=$MP_KIND;checkpoint=$ckpts"' USR2
  trap 'save term; exit 143' TERM
  # the handlers are in place: say so (the adapter signals only a job that declares them)
  scontrol update jobid="$SLURM_JOB_ID" comment="kind=$MP_KIND;checkpoint=0"
else
  trap 'note term; exit 143' TERM
fi
note "start step=$step of $steps gpus=${CUDA_VISIBLE_DEVICES:-}"
while (( step < steps )); do
  sleep 0.2 & wait $!
  step=$((step + 1))
done
note "done step=$step"
