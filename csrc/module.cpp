// Python module of margrpo._C: loading it runs the TORCH_LIBRARY registrations of every csrc file.
// Attributes: with_cuda (the CUDA kernels are built) and cuda_archs (their SM targets, e.g. [900]).
// Function: signature(*tensors) for the public ops' argument memos (margrpo/ops/_validate.py).
#include <pybind11/stl.h>
#include <torch/extension.h>

#include <string>

#ifdef MARGRPO_WITH_CUDA
#include "build_info.h"
#endif

namespace {

void append(std::string& out, int64_t value) { out.append(reinterpret_cast<const char*>(&value), sizeof(value)); }

// The metadata the public ops' checks and layout work depend on, for each argument (a tensor or None),
// packed into one bytes object: rank, sizes, dtype, device, and whether it is contiguous and requires
// grad. Equal bytes mean equal metadata, so it is an exact memo key; reading the same from Python
// (.shape, .dtype, .device, ... per tensor) costs several times as much, a tenth of a small kernel.
pybind11::bytes signature(const pybind11::args& args) {
  std::string out;
  out.reserve(16 * sizeof(int64_t) * args.size());
  for (const auto& arg : args) {
    PyObject* object = arg.ptr();
    if (object == Py_None) {
      append(out, -1);
      continue;
    }
    if (!THPVariable_Check(object)) throw pybind11::type_error("signature: expected tensors or None");
    const at::Tensor& t = THPVariable_Unpack(object);
    // symbolic sizes (a tracer's fake tensor) have no fixed value to key on: the caller then checks
    // every call, as for any argument it cannot key
    if (t.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) throw pybind11::type_error("signature: symbolic sizes");
    append(out, t.dim());
    for (const int64_t size : t.sizes()) append(out, size);
    append(out, static_cast<int64_t>(t.scalar_type()));
    append(out, static_cast<int64_t>(t.device().type()) << 16 | static_cast<int64_t>(t.device().index() + 1));
    append(out, static_cast<int64_t>(t.is_contiguous()) | static_cast<int64_t>(t.requires_grad()) << 1);
  }
  return pybind11::bytes(out);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
#ifdef MARGRPO_WITH_CUDA
  m.attr("with_cuda") = true;
  m.attr("cuda_archs") = margrpo::cuda_archs();
#else
  m.attr("with_cuda") = false;
  m.attr("cuda_archs") = std::vector<int>{};
#endif
  m.def("signature", &signature, "rank, sizes, dtype, device, contiguity and requires_grad of each tensor argument (None allowed), as bytes");
}
