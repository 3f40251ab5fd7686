"""A 3D-parallel (TP x PP x DP) GPT trainer on torch.distributed that leaves what diag needs:
torch.profiler traces, labelled collective timings, device metrics and run metadata."""
