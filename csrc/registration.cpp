// The one TORCH_LIBRARY block of the `margrpo` namespace. Every kernel file adds its schemas with
// TORCH_LIBRARY_FRAGMENT and its implementations with TORCH_LIBRARY_IMPL, so files stay independent.
#include <torch/library.h>

TORCH_LIBRARY(margrpo, m) {}
