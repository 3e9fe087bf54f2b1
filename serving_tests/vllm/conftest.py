"""The vLLM tests' process: lift vLLM 0.34's x86 triton-cpu check (cpu_platform.py says why). Each spawned
rank does the same through the harness modules it imports."""

from cpu_platform import allow_x86_without_triton

allow_x86_without_triton()
