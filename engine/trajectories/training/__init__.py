"""Training on the scored trajectories: the sampler, the advantage-weighted SFT export, the LoRA training
run, and the plan evaluation on the hold-out."""
