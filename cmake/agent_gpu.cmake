# ---- agent: GPU discovery (NVML at run time, simulated inventories) and GPU metrics ----
# (filled in by the NVML work)
