"""Builds margrpo._C from csrc/: C++ CPU kernels always, CUDA kernels when torch has CUDA and nvcc.

Environment:
  MARGRPO_BUILD_CUDA=0/1   force the CUDA part off/on (default: on when torch.version.cuda and nvcc exist)
  MARGRPO_NO_EXTENSION=1   skip the extension entirely (pure Python install; torch/triton backends only)
  TORCH_CUDA_ARCH_LIST     defaults to "9.0" (Hopper) when no GPU is visible
"""

import glob
import os
import shutil

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
PACKAGES = find_packages(include=["margrpo", "margrpo.*"])


class BuildPy(build_py):
    """margrpo.kernels takes its modules from the top-level kernels/ folder, which is no package (no
    __init__.py: from the checkout root it would shadow the PyPI package `kernels`); its __init__.py
    is margrpo/kernels/__init__.py."""

    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        if package == "margrpo.kernels":
            sources = sorted(glob.glob(os.path.join("kernels", "*.py")))
            modules += [(package, os.path.splitext(os.path.basename(f))[0], f) for f in sources]
        return modules


def _want_cuda(torch_module) -> bool:
    flag = os.environ.get("MARGRPO_BUILD_CUDA")
    if flag is not None:
        return flag == "1"
    from torch.utils.cpp_extension import CUDA_HOME

    return torch_module.version.cuda is not None and (CUDA_HOME is not None or shutil.which("nvcc") is not None)


def _extensions():
    if os.environ.get("MARGRPO_NO_EXTENSION") == "1":
        return [], {}
    # An `nvcc` on PATH may be a wrapper outside the toolkit (/usr/local/bin/nvcc): torch would then
    # take CUDA_HOME=/usr/local and fail to link libcudart. Prefer the standard toolkit location, which
    # is torch's own fallback (set before torch.utils.cpp_extension reads it at import).
    if not (os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")) and os.path.exists("/usr/local/cuda/bin/nvcc"):
        os.environ["CUDA_HOME"] = "/usr/local/cuda"
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

    cpp_sources = sorted(glob.glob(os.path.join("csrc", "*.cpp")))
    cu_sources = sorted(glob.glob(os.path.join("csrc", "*.cu")))
    # the kernels read neither errno nor the floating-point exception flags: without these two, GCC
    # keeps sqrt calls and the selects of the polynomial log (csrc/cpu_math.h) out of vector loops
    cxx_flags = ["-O3", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-std=c++20"]
    link_flags = ["-fopenmp"]
    if _want_cuda(torch) and cu_sources:
        if not os.environ.get("TORCH_CUDA_ARCH_LIST") and not torch.cuda.is_available():
            os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0"  # no GPU visible: build for Hopper
        # the local toolkit may lack cuBLAS headers that torch includes; the pip CUDA wheels carry them
        nvidia_include = os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "cu13", "include")
        include_dirs = [os.path.abspath(nvidia_include)] if os.path.isdir(nvidia_include) else []
        ext = CUDAExtension(
            "margrpo._C",
            cpp_sources + cu_sources,
            include_dirs=include_dirs,
            define_macros=[("MARGRPO_WITH_CUDA", "1")],
            extra_compile_args={"cxx": cxx_flags, "nvcc": ["-O3", "--use_fast_math", "-std=c++20"]},
            extra_link_args=link_flags,
        )
    else:
        ext = CppExtension("margrpo._C", cpp_sources, extra_compile_args=cxx_flags, extra_link_args=link_flags)
    return [ext], {"build_ext": BuildExtension.with_options(use_ninja=True)}


ext_modules, cmdclass = _extensions()
# data read at run time: the prompt splits, the shipped checkpoints (margrpo.checkpoints) and the
# measured backend order of the fused ops (margrpo.ops._table)
PACKAGE_DATA = {"margrpo.testbed": ["prompts/*.txt"], "margrpo.checkpoints": ["*/*"], "margrpo.ops": ["backend_table.json"]}
setup(packages=PACKAGES, package_data=PACKAGE_DATA, ext_modules=ext_modules, cmdclass={"build_py": BuildPy, **cmdclass})
