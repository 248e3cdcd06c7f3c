// Catch2 runner for tests under mpirun: MPI is initialised once, by the Communicator every
// test shares (test_comm()), and finalised after the last test. A failing REQUIRE on one rank
// makes that rank exit non-zero; ranks waiting for it in a collective are stopped by mpirun
// or, at worst, by the ctest TIMEOUT: a hang fails, it never passes.
#define CATCH_CONFIG_RUNNER
#define CATCH_CONFIG_CONSOLE_WIDTH 200  // long failure reports stay on one line
#include <catch2/catch.hpp>

#include "mpi/test_comm.hpp"

ringzero::Communicator* g_test_comm = nullptr;
ringzero::Communicator& test_comm() {
  return *g_test_comm;
}

int main(int argc, char** argv) {
  ringzero::Communicator comm(argc, argv);
  g_test_comm = &comm;
  return Catch::Session().run(argc, argv);
}
