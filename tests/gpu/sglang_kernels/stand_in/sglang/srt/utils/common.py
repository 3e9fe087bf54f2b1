# Stand-in (test equipment): sglang/srt/utils/common.py imports most of the serving runtime. The JIT
# loader uses two functions of it (sglang/kernels/jit/utils/arch.py); both are copied here verbatim
# from sglang 0.5.23's sglang/srt/utils/common.py (lines 158-159 and 254-257).
import torch


def is_cuda():
    return torch.cuda.is_available() and torch.version.cuda is not None


def get_cuda_version():
    if torch.version.cuda:
        return tuple(map(int, torch.version.cuda.split(".")))
    return (0, 0)
