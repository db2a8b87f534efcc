// The column kernel's sum-rule instantiations (col_launch.cuh says why each rule has its own file).
#include "col_launch.cuh"

namespace fw {

template void launch_col_mode<ColMode::kSum>(const ColTensors& t);

}  // namespace fw
