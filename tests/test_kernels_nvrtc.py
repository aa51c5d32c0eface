"""The CUDA source of sim/costs/kernels.py compiles, without a GPU: NVRTC from the
``nvidia-cuda-nvrtc-cu12`` wheel (the ``test`` extra, Linux) through ctypes, for sm_80 (A100) and
sm_90 (H100), as CuPy's ``RawKernel`` would compile it (no headers, no include path)."""

import ctypes
import importlib.util
import os
import sys

import pytest

from sim.costs.kernels import _CUDA_PAGED_DECODE

KERNEL = "paged_decode_attention"  # the name _cuda_kernel asks RawKernel for


def _libnvrtc():
    spec = importlib.util.find_spec("nvidia.cuda_nvrtc") if sys.platform == "linux" else None
    if spec is None:
        return None
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, "lib", "libnvrtc.so.12")
        if os.path.exists(path):
            lib = ctypes.CDLL(path)
            lib.nvrtcGetErrorString.restype = ctypes.c_char_p
            return lib
    return None


NVRTC = _libnvrtc()
pytestmark = pytest.mark.skipif(NVRTC is None, reason="needs the nvidia-cuda-nvrtc-cu12 wheel "
                                "on Linux: pip install -e '.[test]'")


def _call(name, *args):
    rc = getattr(NVRTC, name)(*args)
    if rc != 0:
        raise RuntimeError(f"{name}: {NVRTC.nvrtcGetErrorString(rc).decode()}")


def _read(prog, size_fn, get_fn):
    n = ctypes.c_size_t()
    _call(size_fn, prog, ctypes.byref(n))
    buf = ctypes.create_string_buffer(n.value)
    _call(get_fn, prog, buf)
    return buf.raw[:n.value]


def nvrtc_compile(source: str, arch: str):
    """``(ok, log, ptx, cubin)`` of compiling ``source`` for ``arch`` (e.g. "sm_80")."""
    prog = ctypes.c_void_p()
    _call("nvrtcCreateProgram", ctypes.byref(prog), source.encode(), b"paged_decode.cu", 0,
          None, None)
    try:
        opts = [f"--gpu-architecture={arch}".encode()]
        rc = NVRTC.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        log = _read(prog, "nvrtcGetProgramLogSize", "nvrtcGetProgramLog").rstrip(b"\0").decode()
        if rc != 0:
            return False, log, None, None
        ptx = _read(prog, "nvrtcGetPTXSize", "nvrtcGetPTX").rstrip(b"\0").decode()
        cubin = _read(prog, "nvrtcGetCUBINSize", "nvrtcGetCUBIN")
        return True, log, ptx, cubin
    finally:
        NVRTC.nvrtcDestroyProgram(ctypes.byref(prog))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_paged_decode_kernel_compiles_to_ptx_and_cubin(arch):
    ok, log, ptx, cubin = nvrtc_compile(_CUDA_PAGED_DECODE, arch)
    assert ok, log
    assert f".target {arch}" in ptx
    assert f".entry {KERNEL}(" in ptx  # extern "C": the unmangled name RawKernel looks up
    assert ".extern .shared" in ptx  # the dynamic shared buffer the launch sizes
    assert cubin[:4] == b"\x7fELF"


def test_a_syntax_error_fails_the_compile():
    """The harness catches a broken source (here: one semicolon dropped)."""
    broken = _CUDA_PAGED_DECODE.replace("int L = context_lens[b];", "int L = context_lens[b]", 1)
    assert broken != _CUDA_PAGED_DECODE
    ok, log, ptx, _ = nvrtc_compile(broken, "sm_80")
    assert not ok and ptx is None
    assert "error" in log
