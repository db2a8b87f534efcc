// The column kernel's gated-delta-rule instantiations (col_launch.cuh says why each rule has its own file).
#include "col_launch.cuh"

namespace fw {

template void launch_col_mode<ColMode::kGatedDelta>(const ColTensors& t);
template void launch_col_mode<ColMode::kGatedDeltaGrad>(const ColTensors& t);

}  // namespace fw
