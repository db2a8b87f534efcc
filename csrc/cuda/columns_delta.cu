// The column kernel's delta-rule instantiations (col_launch.cuh says why each rule has its own file).
#include "col_launch.cuh"

namespace fw {

template void launch_col_mode<ColMode::kDelta>(const ColTensors& t);
template void launch_col_mode<ColMode::kDeltaGrad>(const ColTensors& t);

}  // namespace fw
