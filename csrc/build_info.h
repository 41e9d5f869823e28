// What the CUDA part of the build targeted (defined in build_info.cu, built only with CUDA).
#pragma once

#include <vector>

namespace margrpo {

// The SM architectures nvcc compiled device code for, e.g. {900} for sm_90 (nvcc's __CUDA_ARCH_LIST__).
std::vector<int> cuda_archs();

}  // namespace margrpo
