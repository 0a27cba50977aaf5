"""`tr calibrate`'s measuring side (needs the `engine` extra; workers run in their own processes): pass grids,
co-run grids under MPS, the runtime's own costs, and the assembly of what they measured into a `Profile`."""
