"""PyTorch's best settings on this machine, chosen before torch is imported.

Debian's OpenBLAS 0.3.21 (which Debian's torch uses for its matrix products) does not know
recent CPUs: on an AVX-512 AMD Zen 4 it runs its AVX2 'Haswell' kernels (measured here: PyTorch's
GPT-2-small training at 226 tokens/s with them, 333 with OPENBLAS_CORETYPE=SkylakeX), and on
some new Xeons it falls back to the generic 'Prescott' kernel. OpenBLAS reads the variable when
it loads, so it is set here, before `import torch`. A value already in the environment is kept
unless it names a kernel below the CPU's (some machines set OPENBLAS_CORETYPE=Haswell for every
process, AVX-512 ones included). `python3 bench/torch_best.py` prints the kernel, for scripts
that give qkv's own OpenBLAS calls the same one.
"""
import os
import subprocess
import sys

PROBE = """import ctypes
try:
    h = ctypes.CDLL('libopenblas.so.0'); h.openblas_get_corename.restype = ctypes.c_char_p
    print(h.openblas_get_corename().decode())
except OSError:
    print('unknown')"""


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


AVX2_OR_LESS = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Sandybridge", "Haswell", "Zen",
                "Atom", "Barcelona", "Bulldozer", "Piledriver", "Steamroller", "Excavator"}


def choose_openblas_kernel():
    """Sets OPENBLAS_CORETYPE when OpenBLAS would run a kernel below what the CPU can do.
    Returns (the kernel OpenBLAS would run without this, what was set or None)."""
    before = os.environ.get("OPENBLAS_CORETYPE")
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    detected = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env).stdout.strip()
    current = before or detected
    flags = cpu_flags()
    choice = None
    if current.capitalize() in {k.capitalize() for k in AVX2_OR_LESS} and \
            {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        choice = "SkylakeX"
    elif current == "Prescott" and {"avx2", "fma"} <= flags:
        choice = "Haswell"
    if choice:
        os.environ["OPENBLAS_CORETYPE"] = choice
    return current, choice


if __name__ == "__main__":
    current, choice = choose_openblas_kernel()
    print(choice or current)
