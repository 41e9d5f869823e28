// Python module of margrpo._C: loading it runs the TORCH_LIBRARY registrations of every csrc file.
// Attributes: with_cuda (the CUDA kernels are built) and cuda_archs (their SM targets, e.g. [900]).
#include <pybind11/stl.h>
#include <torch/extension.h>

#ifdef MARGRPO_WITH_CUDA
#include "build_info.h"
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
#ifdef MARGRPO_WITH_CUDA
  m.attr("with_cuda") = true;
  m.attr("cuda_archs") = margrpo::cuda_archs();
#else
  m.attr("with_cuda") = false;
  m.attr("cuda_archs") = std::vector<int>{};
#endif
}
