# ---- agent: task runtimes (process, runc) ----
# (filled in by the runtime work)
