file(REMOVE_RECURSE
  "../bin/ch01_training_loop"
  "../bin/ch01_training_loop.pdb"
  "CMakeFiles/ch01_training_loop.dir/01_training_loop/main.cpp.o"
  "CMakeFiles/ch01_training_loop.dir/01_training_loop/main.cpp.o.d"
)

# Per-language clean rules from dependency scanning.
foreach(lang CXX)
  include(CMakeFiles/ch01_training_loop.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
