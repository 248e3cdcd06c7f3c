// The communicator the MPI test runner (tests/mpi/main.cpp) creates for every test.
#pragma once
#include "common/comm/comm.hpp"
ringzero::Communicator& test_comm();
