file(REMOVE_RECURSE
  "CMakeFiles/ringzero_common.dir/autograd.cpp.o"
  "CMakeFiles/ringzero_common.dir/autograd.cpp.o.d"
  "CMakeFiles/ringzero_common.dir/check.cpp.o"
  "CMakeFiles/ringzero_common.dir/check.cpp.o.d"
  "CMakeFiles/ringzero_common.dir/comm.cpp.o"
  "CMakeFiles/ringzero_common.dir/comm.cpp.o.d"
  "CMakeFiles/ringzero_common.dir/config.cpp.o"
  "CMakeFiles/ringzero_common.dir/config.cpp.o.d"
  "CMakeFiles/ringzero_common.dir/data.cpp.o"
  "CMakeFiles/ringzero_common.dir/data.cpp.o.d"
  "CMakeFiles/ringzero_common.dir/ledger.cpp.o"
  "CMakeFiles/ringzero_common.dir/ledger.cpp.o.d"
  "CMakeFiles/ringzero_common.dir/metrics.cpp.o"
  "CMakeFiles/ringzero_common.dir/metrics.cpp.o.d"
  "CMakeFiles/ringzero_common.dir/nn.cpp.o"
  "CMakeFiles/ringzero_common.dir/nn.cpp.o.d"
  "CMakeFiles/ringzero_common.dir/ops.cpp.o"
  "CMakeFiles/ringzero_common.dir/ops.cpp.o.d"
  "CMakeFiles/ringzero_common.dir/optim.cpp.o"
  "CMakeFiles/ringzero_common.dir/optim.cpp.o.d"
  "CMakeFiles/ringzero_common.dir/safetensors.cpp.o"
  "CMakeFiles/ringzero_common.dir/safetensors.cpp.o.d"
  "CMakeFiles/ringzero_common.dir/tensor.cpp.o"
  "CMakeFiles/ringzero_common.dir/tensor.cpp.o.d"
  "CMakeFiles/ringzero_common.dir/train.cpp.o"
  "CMakeFiles/ringzero_common.dir/train.cpp.o.d"
  "libringzero_common.a"
  "libringzero_common.pdb"
)

# Per-language clean rules from dependency scanning.
foreach(lang CXX)
  include(CMakeFiles/ringzero_common.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
