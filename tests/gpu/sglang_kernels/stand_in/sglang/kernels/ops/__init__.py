# Stand-in (test equipment, not SGLang code): the wheel's own __init__ imports the serving runtime
# (frontend language, kernel registry, platforms) or, for sgl_kernel, loads 1.1 GB of unrelated CUDA
# libraries; none of it takes part in building or running the Marlin MoE / repack JIT kernels.
