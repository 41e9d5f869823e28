// margrpo._C.cuda_archs: the architectures this build's device code targets, so a test can check that
// the CUDA kernels really were compiled for Hopper (sm_90) without a GPU at hand.
#include "build_info.h"

namespace margrpo {

std::vector<int> cuda_archs() { return {__CUDA_ARCH_LIST__}; }

}  // namespace margrpo
