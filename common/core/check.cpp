#include "common/core/check.hpp"

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

namespace ringzero {
namespace {
int g_rank = 0;
int g_world_size = 1;
}  // namespace

void set_rank_context(int rank, int world_size) {
  g_rank = rank;
  g_world_size = world_size;
}
int context_rank() {
  return g_rank;
}
int context_world_size() {
  return g_world_size;
}

void fail(const char* file, int line, const std::string& msg) {
  std::string f = file;
  // Paths relative to the repository read better than the build machine's absolute ones.
  for (const char* root : {"/common/", "/chapters/", "/tests/"}) {
    auto pos = f.rfind(root);
    if (pos != std::string::npos) {
      f = f.substr(pos + 1);
      break;
    }
  }
  std::ostringstream os;
  os << "[rank " << g_rank << "/" << g_world_size << "] " << f << ":" << line << ": " << msg;
  throw Error(os.str());
}

void exercise_stub(const char* id, const char* task) {
  std::ostringstream os;
  os << "[rank " << g_rank << "/" << g_world_size << "] EXERCISE " << id
     << " is not done yet: " << task << " (scripts/exercise hint " << id << ")";
  throw Error(os.str());
}

int run_main(const std::function<int()>& body) {
  std::string message;
  try {
    return body();
  } catch (const Error& e) {
    message = e.what();
  } catch (const std::exception& e) {
    message = "[rank " + std::to_string(g_rank) + "/" + std::to_string(g_world_size) +
              "] error: " + e.what();
  }
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) {
    // A grace period before the abort kills every rank: the others failing the same check (a
    // flag, a missing GPU) print their own message first, so every rank names its error.
    if (g_world_size > 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return 1;
}

void print0(const std::string& line) {
  if (g_rank != 0) return;
  std::fputs(line.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

}  // namespace ringzero
