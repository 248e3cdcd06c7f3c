// The Catch2 runner of the unit tests (no MPI): every other tests/unit/*.cpp file is a test
// file compiled into the same unit_tests binary.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
