
# Consider dependencies only in project.
set(CMAKE_DEPENDS_IN_PROJECT_ONLY OFF)

# The set of languages for which implicit dependencies are needed:
set(CMAKE_DEPENDS_LANGUAGES
  )

# The set of dependency files which are needed:
set(CMAKE_DEPENDS_DEPENDENCY_FILES
  "/work/main/common/autograd.cpp" "common/CMakeFiles/ringzero_common.dir/autograd.cpp.o" "gcc" "common/CMakeFiles/ringzero_common.dir/autograd.cpp.o.d"
  "/work/main/common/check.cpp" "common/CMakeFiles/ringzero_common.dir/check.cpp.o" "gcc" "common/CMakeFiles/ringzero_common.dir/check.cpp.o.d"
  "/work/main/common/comm.cpp" "common/CMakeFiles/ringzero_common.dir/comm.cpp.o" "gcc" "common/CMakeFiles/ringzero_common.dir/comm.cpp.o.d"
  "/work/main/common/config.cpp" "common/CMakeFiles/ringzero_common.dir/config.cpp.o" "gcc" "common/CMakeFiles/ringzero_common.dir/config.cpp.o.d"
  "/work/main/common/data.cpp" "common/CMakeFiles/ringzero_common.dir/data.cpp.o" "gcc" "common/CMakeFiles/ringzero_common.dir/data.cpp.o.d"
  "/work/main/common/ledger.cpp" "common/CMakeFiles/ringzero_common.dir/ledger.cpp.o" "gcc" "common/CMakeFiles/ringzero_common.dir/ledger.cpp.o.d"
  "/work/main/common/metrics.cpp" "common/CMakeFiles/ringzero_common.dir/metrics.cpp.o" "gcc" "common/CMakeFiles/ringzero_common.dir/metrics.cpp.o.d"
  "/work/main/common/nn.cpp" "common/CMakeFiles/ringzero_common.dir/nn.cpp.o" "gcc" "common/CMakeFiles/ringzero_common.dir/nn.cpp.o.d"
  "/work/main/common/ops.cpp" "common/CMakeFiles/ringzero_common.dir/ops.cpp.o" "gcc" "common/CMakeFiles/ringzero_common.dir/ops.cpp.o.d"
  "/work/main/common/optim.cpp" "common/CMakeFiles/ringzero_common.dir/optim.cpp.o" "gcc" "common/CMakeFiles/ringzero_common.dir/optim.cpp.o.d"
  "/work/main/common/safetensors.cpp" "common/CMakeFiles/ringzero_common.dir/safetensors.cpp.o" "gcc" "common/CMakeFiles/ringzero_common.dir/safetensors.cpp.o.d"
  "/work/main/common/tensor.cpp" "common/CMakeFiles/ringzero_common.dir/tensor.cpp.o" "gcc" "common/CMakeFiles/ringzero_common.dir/tensor.cpp.o.d"
  "/work/main/common/train.cpp" "common/CMakeFiles/ringzero_common.dir/train.cpp.o" "gcc" "common/CMakeFiles/ringzero_common.dir/train.cpp.o.d"
  )

# Targets to which this target links.
set(CMAKE_TARGET_LINKED_INFO_FILES
  )

# Fortran module output directory.
set(CMAKE_Fortran_TARGET_MODULE_DIR "")
