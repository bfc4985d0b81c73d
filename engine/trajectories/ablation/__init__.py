"""Signal ablation: leave-one-out over the store's trajectories (leave_one_out.py), and KARL's published
table rebuilt from a record file (karl.py)."""
