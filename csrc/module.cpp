// Python module of margrpo._C: loading it runs the TORCH_LIBRARY registrations of every csrc file.
#include <torch/extension.h>

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
#ifdef MARGRPO_WITH_CUDA
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
}
